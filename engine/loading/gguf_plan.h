// What a GGUF file holds, layer by layer, for `hmoe plan`: the bytes of each
// block (blk.N) per ggml tensor type as stored, the routed experts' share,
// and the tensors outside the blocks; and what of it a GPU of a given size
// takes under the placement plan (engine/placement/placement.h), so that a user with a
// 24 GB card sees which low-bit mix fits before downloading the rest.
// Pure function of the file's tensor table; no weights are read.
#pragma once
#include <cstdint>
#include <string>

namespace hmoe {

namespace io {
class GgufFile;
}
struct Plan;

// The markdown-like table of bytes per layer by type (columns: the types
// present, largest first), with a row for the non-block tensors and a total.
std::string gguf_layer_bytes_report(const io::GgufFile& f);

// One paragraph: which of the file's bytes the plan puts on the GPU (its
// non-expert weights and resident experts as the GPU holds them) and which
// stay in host memory, for the plan's GPU budget.
std::string gguf_fit_report(const io::GgufFile& f, const Plan& p, uint64_t gpu_total_bytes);

}  // namespace hmoe
