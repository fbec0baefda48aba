// Host side of the prefetch window (engine/layers/expert_stream.h): what one
// device slot holds for a streamed MoE layer, where each byte comes from in
// host memory, and the pinning that lets those copies overlap compute.
//
// Two slot layouts:
//  - bf16: [E][2I][H] gate/up rows then [E][H][I] down, as gpu::moe_experts
//    takes them. Host experts that are plain bf16 are pinned in place;
//    anything else is converted once into a pinned bf16 image.
//  - quantized (checkpoints whose every expert matrix has a GPU format,
//    gpu/quant.h, and ExpertStreamOptions::quantized): the two stacked
//    matrices of gpu::quant_moe_experts, gate/up [E*2I rows] and down [E*H
//    rows], each as data, then scales and zeros where the format has them,
//    every region 256-byte aligned. Per layer and stacked matrix: where the
//    GPU format is the stored one byte for byte (GGUF Q8_0/Q4_K with rows of
//    16-byte multiples today: checked on the layer's first expert, not
//    assumed) the stored blocks are pinned in place and copied as they are;
//    otherwise (formats the GPU repacks, e.g. Q6_K into int8 groups) that
//    matrix is repacked once, at load, into a pinned image of its region.
//    When the driver refuses to pin the stored blocks, every region goes
//    into images.
//  - GGUF layers whose every expert matrix the native GGUF kernels take
//    (gpu::gguf_native_supported: Q4_K/Q5_K/Q6_K/Q8_0 and the low-bit
//    Q2_K/Q3_K/IQ1-IQ4/MXFP4, which have no other GPU format): the same two
//    stacked matrices, but always the file's blocks as stored (Q6_K
//    included), so always pinned in place unless the driver refuses.
// Slots differ per layer only in the bytes used (a Q4_K_M file mixes Q4_K
// and Q6_K down matrices); a slot is sized for the largest layer.
//
// Host residence (engine/layers/host_residence.h): a source may give its
// experts' bytes as node pieces (numa::ExpertEngine::pieces: each matrix as
// row slices, one per NUMA node, in anonymous memory) that their owner has
// registered with the driver already; then every copy reads those pieces
// (one copy per piece: an expert's rows follow the node split), nothing is
// pinned here and no image is made for stored blocks.
//
// Contract: build_stream_layout reads the host experts (must outlive the
// result, which keeps views and pins); copy lists are in slot-byte offsets.
// Errors are Error(internal) for inconsistent shapes. No CUDA of its own
// beyond gpu/memory.h, gpu/moe_stream.h (pinning) and gpu/quant.h (repack).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/loading/model_config.h"
#include "gpu/memory.h"
#include "gpu/moe_stream.h"
#include "gpu/quant.h"
#include "numa/expert_engine.h"
#include "numa/thread_pool.h"

namespace hmoe {

struct StreamCopy {
  size_t dst;       // byte offset in a slot
  const void* src;  // pinned host memory
  size_t bytes;
};

// Sorted by destination; neighbours contiguous on both sides become one copy.
void coalesce_copies(std::vector<StreamCopy>& ops);

struct StreamLayerLayout {
  int64_t layer = 0;
  size_t bytes = 0;                                // slot bytes this layer uses
  std::vector<StreamCopy> all;                     // every expert, coalesced
  std::vector<std::vector<StreamCopy>> by_expert;  // per expert (routed fill)
  // Quantized: the two stacked matrices with slot OFFSETS in place of
  // pointers (data/scales/zeros hold offset values; scales/zeros null when
  // the format has none). Rebase with at().
  gpu::QWeight gu, dn;
  // GGUF layers of types the native kernels read as stored
  // (gpu::gguf_native_supported for every expert matrix, low-bit
  // included): the file's blocks as stored, read by the gpu::gguf_*
  // kernels; ngu/ndn hold slot offsets like gu/dn (then unused). Each
  // region is followed by 16 readable bytes (gpu::gguf_moe_gemm's rule).
  bool native = false;
  gpu::GgufWeight ngu, ndn;
  gpu::PinnedBuffer image;  // the pinned image of the regions not pinned in place (one range of the slot)
  gpu::QWeight at(const gpu::QWeight& w, void* slot) const;
  gpu::GgufWeight at(const gpu::GgufWeight& w, void* slot) const;
};

struct StreamLayoutOptions {
  bool quantized = true;      // keep quantized experts quantized (setting gpu_quantized_experts)
  bool force_image = false;   // always repack into a pinned image (ExpertStreamOptions::Source::copy)
  bool skip_copies = false;   // benchmark timing mode: no host memory is read or pinned
  // Register the stored bytes with the driver in place (setting
  // gpu_pin_host_experts, or ExpertStreamOptions::Source::in_place). false:
  // the copies read them as pageable memory (through the driver's staging;
  // no registration, no image).
  bool pin_in_place = false;
};

struct StreamLayout {
  bool quantized = false;
  bool stored_blocks = false;     // quantized: every layer's GPU format is its stored bytes (pinned in place unless refused)
  bool in_place = false;          // every region read where it is stored (no image): pinned there, or pageable
  bool pageable = false;          // the regions read in place are not registered (StreamLayoutOptions::pin_in_place false)
  bool registered = false;        // the regions read in place lie in memory their owner registered (copy residence), every layer
  size_t slot_bytes = 0;          // one slot: the largest layer
  size_t down_off = 0;            // bf16: byte offset of the down matrices
  uint64_t image_bytes = 0;       // host bytes of pinned images
  std::string format;             // "bf16", "Q4_K", "Q4_K / int8-group", ...
  std::string why_image;          // why images were made (empty when in place)
  std::vector<StreamLayerLayout> layers;
  std::vector<gpu::HostRegistration> pins;
};

struct StreamLayerSource {
  int64_t layer;
  const std::vector<numa::ExpertWeights>* experts;  // shapes and types; the bytes unless `pieces`
  // [expert][node]: the bytes as row pieces in row order (copy residence);
  // null: `experts` holds them.
  const std::vector<std::vector<numa::ExpertWeights>>* pieces = nullptr;
  bool registered = false;  // the pieces are registered with the driver by their owner
};

// Layers sorted by index. Throws Error(internal) when a layer has the wrong
// expert count or shapes. pool (null: the calling thread) repacks the
// images' experts in parallel (a Q6_K expert of Qwen3-30B-A3B's shape takes
// ~16 ms on one core).
StreamLayout build_stream_layout(const ModelConfig& c, std::vector<StreamLayerSource> layers, const StreamLayoutOptions& o,
                                 numa::ThreadPool* pool = nullptr);

// Whether every expert of `experts` has a GPU quantized format, one per
// stacked matrix (gate and up alike across experts, down alike): a format
// gpu::qrepack makes, or the stored GGUF blocks when the native kernels take
// every matrix of the layer (the only GPU format of the low-bit types). The
// rule that makes a layer stream quantized. *why names the first obstacle.
bool experts_stream_quantized(const std::vector<numa::ExpertWeights>& experts, std::string* why);

}  // namespace hmoe
