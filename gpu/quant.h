// Quantized weight matrices on the GPU: GEMV (decode, a few tokens) and the
// grouped routed-expert SwiGLU, dequantizing in registers from the packed
// layout the CPU path holds (io/tensor/mat.h, io/tensor/quant_blocks.h), so the same
// bytes are uploaded unchanged. Activations are bf16 (as every GPU matrix
// product here); accumulation is fp32.
//
// Formats (W row-major [rows, cols], y = x W^T):
//  - q8_0:  ggml Q8_0 blocks (f16 d, 32 x int8), [rows][cols/32] x 34 bytes;
//           cols % 32 == 0.
//  - q4_k:  ggml Q4_K super-blocks (f16 d, dmin, 12 bytes of 6-bit
//           scales/mins, 128 bytes of nibbles), [rows][cols/256] x 144 bytes.
//  - int4_group: the int4 view GPTQ/AWQ/compressed-tensors are repacked into
//           (io/tensor/mat.h): data [rows, cols/2], runs of 32 elements in 16
//           bytes (low nibble i, high nibble i+16); scales (and zeros, or
//           null for zero point 8) f32 [rows, cols/group]; group >= 32, a
//           multiple of 32 dividing cols.
//  - int8_group: data [rows, cols] u8 codes, scales (and zeros, or null for
//           zero point 128) f32 [rows, cols/group]; w = scale * (q - zero);
//           group a multiple of 16 dividing cols; cols % 32 == 0. Holds
//           GGUF Q5_0/Q5_1/Q5_K (group 32) and Q6_K (group 16), repacked
//           losslessly from their codes, and int8 GPTQ/compressed-tensors.
//  - fp8_e4m3: data [rows, cols] e4m3 bytes, scales f32 [rows, ceil(cols/group)]
//           (DeepSeek-V3 `weight_scale_inv` expanded per row), group a
//           multiple of 16; cols % 32 == 0. NaN encodings read as +-480, as
//           on the CPU.
// Rows are `stride()` bytes apart: the packed row rounded up to 16 bytes.
// GGUF Q4_0/Q4_1 are repacked into int4_group (group 32, zeros for Q4_1);
// int8 per-channel views into int8_group (group = cols).
// Every pointer is device memory, 16-byte aligned (cudaMalloc'd buffers
// are). Shapes are checked by the launchers (Error(unsupported) naming the
// format and value); pointers are trusted.
//
// Numerics: nibbles and int8 are converted exactly; for int4 and Q4_K the
// kernel sums (128 + q) * x per run of 16 and removes 128 * sum(x) with the
// run's scale (one op per weight fewer), which adds rounding of order
// 2^-24 * 128 * sum|x| per run. Tests bound the error by a small multiple of
// sum_k |w_k x_k|.
//
// In a build without CUDA every launcher and upload throws
// Error(unsupported, "... not built with CUDA").
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/memory.h"
#include "io/tensor/mat.h"

namespace hmoe::gpu {

using bf16_t = uint16_t;  // raw bfloat16 bits (as gpu/kernels.h)

enum class QFormat : uint8_t { q8_0, q4_k, int4_group, int8_group, fp8_e4m3 };
const char* qformat_name(QFormat f);

// A quantized matrix in device memory (not owned).
struct QWeight {
  QFormat format = QFormat::q8_0;
  const void* data = nullptr;
  const float* scales = nullptr;  // int4_group, fp8_e4m3
  const float* zeros = nullptr;   // int4_group asymmetric, else null
  int64_t rows = 0, cols = 0;
  int32_t group = 0;  // int4_group, int8_group, fp8_e4m3
  size_t row_bytes() const;  // packed bytes of one row
  size_t stride() const { return (row_bytes() + 15) / 16 * 16; }
  int64_t groups() const;  // scale columns per row (0 for the ggml formats)
  // Bytes one pass over the matrix streams: data plus scales and zeros.
  size_t bytes() const;
};

// The GPU format of a CPU weight view, or throws Error(unsupported) naming
// `what` and the view's type when the GPU kernels do not take it.
QFormat qformat_of(const cpu::Mat& m, const std::string& what);
// True when qformat_of(m) succeeds and the shape fits the kernels.
bool qformat_supported(const cpu::Mat& m);
// Device bytes per weight of m in its GPU format (data, scales, zeros).
double qformat_bytes_per_weight(const cpu::Mat& m);

// One or more CPU views of the same type, columns and group, stacked by
// rows in the order given, in the GPU layout on the host (what QDeviceMat
// uploads; the tests' reference reads it with qhost_weight_at).
struct QHostMat {
  QWeight w;  // data/scales/zeros point into the vectors below
  std::vector<uint8_t> data;
  std::vector<float> scales, zeros;
};
QHostMat qrepack(const std::vector<cpu::Mat>& parts, const std::string& what);
float qhost_weight_at(const QHostMat& m, int64_t r, int64_t k);
// Throws Error(unsupported / invalid_argument) naming `what` when the shape,
// group or alignment is one the kernels do not take.
void check_qweight(const QWeight& w, const std::string& what);

// Device copy of qrepack(parts) (e.g. every expert's gate rows then up rows):
// the data bytes unchanged where the format is the CPU one, scales and
// zeros as f32.
class QDeviceMat {
 public:
  QDeviceMat() = default;
  QDeviceMat(const std::vector<cpu::Mat>& parts, Stream& s, const std::string& what);
  const QWeight& weight() const { return w_; }

 private:
  DeviceBuffer data_, scales_, zeros_;
  QWeight w_;
};

// y[t, r] (row stride ldy) = sum_k x[t, k] W[r, k] for t < n; x bf16 [n, cols]
// (row stride cols). Any n >= 0; tokens are taken 8 at a time, each weight
// byte read once per 8 tokens.
void quant_gemv(const QWeight& w, const bf16_t* x, int64_t n, float* y, int64_t ldy, Stream& s);

// Grouped routed-expert SwiGLU, the quantized twin of gpu::moe_experts
// (gpu/kernels.h; same routing arrays from moe_route): w_gate_up holds
// `experts` matrices of [2*inter, hidden] stacked by rows (gate rows, then up
// rows, per expert), w_down `experts` matrices of [hidden, inter]. act: [n*k,
// inter] bf16 scratch; partial: [n*k, hidden] fp32 scratch; out[t] = sum_j
// weights[t*k+j] * expert_{ids[t*k+j]}(x[t]) (overwritten). Each expert's
// weight bytes are read once per 8 of its tokens; experts with no token
// cost one empty block each.
void quant_moe_experts(const bf16_t* x, int64_t n, int64_t hidden, int64_t inter, int64_t experts, int64_t k, const float* weights,
                       const int32_t* offsets, const int32_t* pair_list, const QWeight& w_gate_up, const QWeight& w_down, bf16_t* act,
                       float* partial, float* out, Stream& s);

// Rows [r0, r0 + rows) of w dequantized to bf16 into out ([rows, cols]
// row-major, 16-byte aligned): what the big-pass path feeds cuBLAS.
void quant_dequant(const QWeight& w, int64_t r0, int64_t rows, bf16_t* out, Stream& s);

// ---- GGUF blocks as stored (gpu/gguf_gemv.cu, gpu/gguf_moe_gemm.cu) -----------
//
// Q4_K, Q5_K, Q6_K, Q8_0 and the low-bit types of the "dynamic" quants
// (Q2_K, Q3_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS,
// IQ4_NL, MXFP4; io/tensor/quant_blocks_lowbit.h, decoded on the GPU by
// gpu/gguf_lowbit_units.h to the same codes and scales as the CPU).
// The bytes of the file, unchanged: rows of cols/256 super-blocks (Q4_K 144,
// Q5_K 176, Q6_K 210 bytes, the low-bit K and IQ types 50 to 136) or cols/32
// blocks (Q8_0 34, IQ4_NL 18, MXFP4 17 bytes), rows contiguous (row_bytes()
// apart), `data` 16-byte aligned (rows themselves need not be: most rows
// are 2-byte aligned). The kernels never read past data + bytes(). cols: a
// multiple of 256 (K and IQ types but IQ4_NL) or 64 (Q8_0, IQ4_NL, MXFP4).
//
// Numerics (as llama.cpp's and the CPU's integer path, numa/quant_gguf_q8.h):
// activations are quantized per 32 to int8 (scale amax / 127) in shared
// memory by each block, products are int8 dot products (dp4a) per run of 16
// weights, scaled in fp32. Error against the exact product: at most
// sum over 32-blocks of (amax_b / 254) * sum_k |w_k| (plus fp32 rounding).
enum class GgufType : uint8_t { q4_k, q5_k, q6_k, q8_0, q2_k, q3_k, iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_xs, iq4_nl, mxfp4 };
const char* gguf_type_name(GgufType t);
// True for the low-bit types (Q2_K .. MXFP4), whose kernels read the IQ
// codebooks (uploaded to each device once, by GgufDeviceMat or the first launch).
bool gguf_type_lowbit(GgufType t);
// The GgufType of a ggml type id, or false when there is none.
bool gguf_type_from_ggml(uint32_t ggml_type, GgufType& t);

struct GgufWeight {
  GgufType type = GgufType::q4_k;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes() const;
  size_t bytes() const { return static_cast<size_t>(rows) * row_bytes(); }
};
// True when m is a GGUF view (cpu::Quant::ext) of one of the types above
// with a shape the kernels take.
bool gguf_native_supported(const cpu::Mat& m);
// The type of m, or Error(unsupported) naming `what`.
GgufType gguf_type_of(const cpu::Mat& m, const std::string& what);
// Error(unsupported / invalid_argument) naming `what` for a bad shape or alignment.
void check_gguf_weight(const GgufWeight& w, const std::string& what);

// Device copy of the parts stacked by rows (same type and columns), bytes
// as stored, plus the 16 readable bytes past the end gguf_moe_gemm needs.
// Synchronous on s.
class GgufDeviceMat {
 public:
  GgufDeviceMat() = default;
  GgufDeviceMat(const std::vector<cpu::Mat>& parts, Stream& s, const std::string& what);
  const GgufWeight& weight() const { return w_; }

 private:
  DeviceBuffer data_;
  GgufWeight w_;
};

// Which kernels gguf_gemv and gguf_moe_experts run (process-wide; setting
// gpu_gguf_decode_kernel). direct: Q4_K/Q5_K/Q6_K/Q8_0 with each lane
// loading its 64-weight unit from global memory into registers
// (gpu/gguf_gemv_direct.cu); other types, and activations that do not fit
// in shared memory, take the staged kernels; the default since they passed
// on the H100 (2026-12-06 21:52: 1,280 tok/s against dense's 1,137 and
// staged's 1,021 on the Q4_K_M slice). dense: direct for gguf_gemv, staged
// for gguf_moe_experts. staged: the earlier kernels,
// each warp copying its rows into shared memory first (gpu/gguf_gemv.cu),
// for every type. Same numerics (the same int8 activation planes and run
// products; the order of the fp32 sums over runs differs).
enum class GgufDecodeKernel : uint8_t { staged, direct, dense };
void set_gguf_decode_kernel(GgufDecodeKernel k);
GgufDecodeKernel gguf_decode_kernel();

// y[t, r] (row stride ldy) = sum_k x[t, k] W[r, k] for t < n, x bf16 [n, cols].
// For decode-sized n (each weight byte is read once per 8 tokens); larger
// passes should dequantize (gguf_dequant) and use cuBLAS. On a stream with
// programmatic launch (Stream::set_programmatic_launch) it reads w before it
// waits for the kernel in front: w must not be written by device work of
// the same stream (resident weights never are); x after the wait.
void gguf_gemv(const GgufWeight& w, const bf16_t* x, int64_t n, float* y, int64_t ldy, Stream& s);

// Rows [r0, r0 + rows) of w as bf16 into out ([rows, cols], 16-byte aligned).
void gguf_dequant(const GgufWeight& w, int64_t r0, int64_t rows, bf16_t* out, Stream& s);

// Routed experts for few tokens (decode), no routing pass: w_gate_up holds
// E experts' [2*inter, hidden] (gate rows, then up rows), w_down E experts'
// [hidden, inter]; ids/weights [n, k] (gpu::router_topk). gu: [n*k, 2*inter]
// fp32 scratch. out[t] = sum_j weights[t*k+j] * down_e(silu(gate_e x_t) *
// up_e x_t), e = ids[t*k+j] (overwritten; the sum over j in slot order).
// Two launches: gate/up per (token, slot) pair; down per token with the
// SwiGLU and the weighted sum fused. Each pair reads its expert's bytes, so
// this is for n*k up to a few hundred pairs. k <= 16. With programmatic
// launch the down kernel reads ids and its weights while the gate/up kernel
// runs (the gate/up kernel has waited for the writer of ids by then).
void gguf_moe_experts(const bf16_t* x, int64_t n, int64_t k, const int32_t* ids, const float* weights, const GgufWeight& w_gate_up,
                      const GgufWeight& w_down, int64_t inter, float* gu, float* out, Stream& s);

// Grouped expert product on tensor cores for prefill, the blocks dequantized
// in shared memory (no bf16 copy, no host synchronisation: capturable):
// for every expert e < experts and sorted row i in [offsets[e], offsets[e+1])
// (device offsets, gpu::moe_route), c[i, r] = sum_k A_i[k] W_e[r, k] for r <
// rows_per_expert, where W_e is rows [e * rows_per_expert, ...) of w and
// A_i = a + (rowmap ? rowmap[i] / k_div : i) * w.cols (bf16; rowmap = the
// pair list and k_div = top-k reads the token rows in place). c: fp32
// [pairs, rows_per_expert]. Products in bf16 with fp32 accumulation (as
// cuBLAS on the dequantized weights). Reads up to 16 bytes past the last
// weight row (GgufDeviceMat allocates them). Needs
// gguf_moe_gemm_supported(w, rows_per_expert): cols % 256 == 0, rows % 128 == 0.
bool gguf_moe_gemm_supported(const GgufWeight& w, int64_t rows_per_expert);
// Which kernel gguf_moe_gemm runs (process-wide; setting
// gpu_gguf_prefill_kernel). simple (the default): 64-row tiles, 256 columns
// a step, no pipelining (gpu/gguf_moe_gemm.cu). pipelined: 64-column steps
// in a two-stage cp.async pipeline, ldmatrix fragments, the next step
// dequantized while the tensor cores run this one
// (gpu/gguf_moe_gemm_pipelined.cu), with 128-row tiles when the pass has at
// least 96 rows per expert on average and 64-row tiles otherwise;
// pipelined64 / pipelined128 force the tile; on GPUs that cannot give a
// block its 142-170 KB of shared memory (sm_86, sm_89) the pipelined choices
// run the simple kernel. Same numerics (the same bf16
// weights; fp32 sums in a different order). Issue 27; pipelined is the
// default since it ran on an H100 (2026-12-07: tests pass; Q8_0 / Q4_K MoE
// layers at 8192 tokens 127 / 128 TFLOP/s against simple's 72 / 81).
enum class GgufPrefillKernel : uint8_t { simple, pipelined, pipelined64, pipelined128 };
void set_gguf_prefill_kernel(GgufPrefillKernel k);
GgufPrefillKernel gguf_prefill_kernel();
const char* gguf_prefill_kernel_name(GgufPrefillKernel k);
void gguf_moe_gemm(const bf16_t* a, const int32_t* rowmap, int64_t k_div, int64_t pairs, const int32_t* offsets, int64_t experts, const GgufWeight& w,
                   int64_t rows_per_expert, float* c, Stream& s);

// Reads `bytes` (a multiple of 16) at `data` with 16-byte loads over the
// whole device and stores a checksum at *sink: the read-bandwidth roofline
// the benchmarks compare these kernels against.
void read_probe(const void* data, size_t bytes, uint32_t* sink, Stream& s);

}  // namespace hmoe::gpu
