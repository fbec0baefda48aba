// What a streamed MoE layer's device slot holds (engine/layers/expert_stream_layout.h),
// planned on the host without a GPU (timing mode: no host memory pinned or
// copied): GGUF experts keep their GPU quantized format, regions are sized
// from gpu::qrepack of the layer's first expert (not from constants), a
// slot fits the largest layer, stored blocks are recognised as the GPU's
// own bytes only where they are, and anything the GPU kernels do not take
// (or experts of mixed types) streams as bf16 with the reason said.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "configs/error.h"
#include "engine/layers/expert_stream_layout.h"
#include "io/dtype.h"
#include "numa/quant_gguf.h"
#include "tests/quant_tools/lowbit_blocks.h"
#include "tests/quant_tools/quantizers.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

constexpr int64_t H = 256, I = 256, E = 4;

// Owns the quantized bytes of one layer's experts.
struct Layer {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<std::vector<uint16_t>> bf16;
  std::vector<numa::ExpertWeights> experts;
};

cpu::Mat make(Layer& l, uint32_t type, int64_t rows, int64_t cols, uint64_t seed) {
  const auto v = test::random_floats(static_cast<size_t>(rows * cols), seed, 0.05f);
  if (type == 0) {
    l.bf16.emplace_back(v.size());
    for (size_t i = 0; i < v.size(); ++i) l.bf16.back()[i] = f32_to_bf16(v[i]);
    return cpu::Mat{DType::bf16, l.bf16.back().data(), rows, cols};
  }
  if (cpu::lowbit_type(type))  // random blocks of the format (no quantizer of these types here)
    l.bytes.push_back(qtools::lowbit_random_rows(static_cast<cpu::ExtType>(type), rows, cols, seed, 0.05f));
  else
    l.bytes.push_back(qtools::quant_rows(static_cast<cpu::ExtType>(type), v.data(), rows, cols));
  return cpu::ext_view(static_cast<cpu::ExtType>(type), l.bytes.back().data(), rows, cols, "expert");
}

// gate/up of type gu, down of type dn (0: bf16); expert `odd` gets gate type odd_type.
void fill(Layer& l, uint32_t gu, uint32_t dn, int odd = -1, uint32_t odd_type = 0) {
  l.bytes.reserve(3 * E);
  l.bf16.reserve(3 * E);
  for (int64_t e = 0; e < E; ++e) {
    const uint64_t s = 100 + static_cast<uint64_t>(e) * 3;
    const cpu::Mat g = make(l, e == odd ? odd_type : gu, I, H, s), u = make(l, gu, I, H, s + 1), d = make(l, dn, H, I, s + 2);
    l.experts.push_back({g, u, d});
  }
}

ModelConfig config() {
  ModelConfig c;
  c.hidden_size = H;
  c.moe_intermediate_size = I;
  c.num_experts = E;
  c.num_experts_per_tok = 2;
  return c;
}

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// Slot bytes of a layer from qrepack of its expert 0 (the rule the layout documents).
size_t expected_bytes(const numa::ExpertWeights& w) {
  auto region = [](const gpu::QHostMat& h) {
    size_t b = align256(h.data.size() * E);
    if (!h.scales.empty()) b += align256(h.scales.size() * 4 * E);
    if (!h.zeros.empty()) b += align256(h.zeros.size() * 4 * E);
    return b;
  };
  return region(gpu::qrepack({w.gate, w.up}, "gu")) + region(gpu::qrepack({w.down}, "dn"));
}

}  // namespace

TEST_CASE("streamed slots of GGUF K-quant and Q8_0 experts: the file's blocks as stored, sized on the largest layer") {
  const ModelConfig c = config();
  Layer q4, q4q6;
  fill(q4, 12, 12);    // Q4_K everywhere (a Q4_K_M file's plain layers)
  fill(q4q6, 12, 14);  // Q4_K gate/up, Q6_K down (its "more bits" layers)
  StreamLayoutOptions o;
  o.skip_copies = true;
  const StreamLayout lay = build_stream_layout(c, {{5, &q4q6.experts}, {2, &q4.experts}}, o);
  CHECK(lay.quantized);
  CHECK(lay.stored_blocks);
  REQUIRE(lay.layers.size() == 2);
  CHECK(lay.layers[0].layer == 2);  // sorted by layer
  CHECK(lay.layers[1].layer == 5);
  CHECK(lay.layers[0].native);
  CHECK(lay.layers[1].native);
  // Regions: the stored rows (Q4_K 144 bytes per 256 weights, Q6_K 210), 16 readable bytes after each, 256-byte aligned.
  const size_t gu = align256(static_cast<size_t>(E * 2 * I) * 144 + 16);
  CHECK(lay.layers[0].bytes == gu + align256(static_cast<size_t>(E * H) * 144 + 16));
  CHECK(lay.layers[1].bytes == gu + align256(static_cast<size_t>(E * H) * 210 + 16));
  CHECK(lay.slot_bytes == lay.layers[1].bytes);
  const gpu::GgufWeight& ngu = lay.layers[1].ngu;
  CHECK(ngu.type == gpu::GgufType::q4_k);
  CHECK(ngu.rows == E * 2 * I);
  CHECK(ngu.cols == H);
  CHECK(reinterpret_cast<uintptr_t>(ngu.data) == 0);
  CHECK(lay.layers[1].ndn.type == gpu::GgufType::q6_k);
  CHECK(lay.layers[1].ndn.rows == E * H);
  CHECK(reinterpret_cast<uintptr_t>(lay.layers[1].ndn.data) == gu);
  CHECK(lay.format == "Q4_K, Q4_K / Q6_K");  // in layer order
  // Rebasing the offsets onto a slot address.
  char slot[16];
  CHECK(static_cast<const char*>(lay.layers[1].at(lay.layers[1].ndn, slot).data) == slot + gu);
  Layer q8;
  fill(q8, 8, 8);
  const StreamLayout l8 = build_stream_layout(c, {{0, &q8.experts}}, o);
  CHECK(l8.layers[0].native);
  CHECK(l8.format == "Q8_0");
}

TEST_CASE("streamed slots of low-bit GGUF experts (dynamic quant mixes): the file's blocks as stored, sized from each type's block bytes") {
  const ModelConfig c = config();
  // A dynamic mix's layers: IQ1_S gate/up with IQ2_XXS down, IQ2_XXS with
  // Q2_K down, and IQ4_NL gate/up with MXFP4 down (32-weight blocks).
  Layer a, b, d;
  fill(a, 19, 16);
  fill(b, 16, 10);
  fill(d, 20, 39);
  std::string why;
  CHECK_MESSAGE(experts_stream_quantized(a.experts, &why), why);
  StreamLayoutOptions o;
  o.skip_copies = true;
  const StreamLayout lay = build_stream_layout(c, {{3, &a.experts}, {1, &b.experts}, {7, &d.experts}}, o);
  CHECK(lay.quantized);
  CHECK(lay.stored_blocks);
  REQUIRE(lay.layers.size() == 3);
  // Bytes per 256 weights as the format stores them: IQ1_S 50, IQ2_XXS 66,
  // Q2_K 84, IQ4_NL 8 x 18, MXFP4 8 x 17.
  struct Want {
    int layer;
    gpu::GgufType gu, dn;
    size_t gu_row, dn_row;
  };
  const Want want[3] = {{1, gpu::GgufType::iq2_xxs, gpu::GgufType::q2_k, 66, 84},
                        {3, gpu::GgufType::iq1_s, gpu::GgufType::iq2_xxs, 50, 66},
                        {7, gpu::GgufType::iq4_nl, gpu::GgufType::mxfp4, 144, 136}};
  size_t largest = 0;
  for (size_t j = 0; j < 3; ++j) {
    const StreamLayerLayout& L = lay.layers[j];
    INFO("layer " << want[j].layer);
    CHECK(L.layer == want[j].layer);
    CHECK(L.native);
    CHECK(L.ngu.type == want[j].gu);
    CHECK(L.ndn.type == want[j].dn);
    CHECK(L.ngu.rows == E * 2 * I);
    CHECK(L.ndn.rows == E * H);
    CHECK(L.ngu.row_bytes() == want[j].gu_row * (H / 256));
    CHECK(L.ndn.row_bytes() == want[j].dn_row * (I / 256));
    const size_t gu = align256(static_cast<size_t>(E * 2 * I) * want[j].gu_row * (H / 256) + 16);
    CHECK(reinterpret_cast<uintptr_t>(L.ngu.data) == 0);
    CHECK(reinterpret_cast<uintptr_t>(L.ndn.data) == gu);
    CHECK(L.bytes == gu + align256(static_cast<size_t>(E * H) * want[j].dn_row * (I / 256) + 16));
    largest = std::max(largest, L.bytes);
  }
  CHECK(lay.slot_bytes == largest);
  CHECK(lay.format == "IQ2_XXS / Q2_K, IQ1_S / IQ2_XXS, IQ4_NL / MXFP4");
  // A low-bit layer with one matrix the native kernels do not take (Q4_0,
  // which only the repacked formats take) has no GPU quantized format: bf16, said why.
  Layer odd;
  fill(odd, 16, 16, 2, 2);
  CHECK(!experts_stream_quantized(odd.experts, &why));
  CHECK_MESSAGE(why.find("as stored only") != std::string::npos, why);
  CHECK(!build_stream_layout(c, {{4, &odd.experts}}, o).quantized);
}

TEST_CASE("streamed slots of GGUF types the GPU repacks (Q4_0, Q5_0): regions from gpu::qrepack of the first expert") {
  const ModelConfig c = config();
  Layer q40, q50;
  fill(q40, 2, 2);  // Q4_0 -> int4 groups
  fill(q50, 6, 6);  // Q5_0 -> int8 groups
  StreamLayoutOptions o;
  o.skip_copies = true;
  const StreamLayout lay = build_stream_layout(c, {{1, &q40.experts}, {4, &q50.experts}}, o);
  CHECK(lay.quantized);
  CHECK(!lay.stored_blocks);
  REQUIRE(lay.layers.size() == 2);
  CHECK(!lay.layers[0].native);
  const size_t b0 = expected_bytes(q40.experts[0]), b1 = expected_bytes(q50.experts[0]);
  CHECK(lay.layers[0].bytes == b0);
  CHECK(lay.layers[1].bytes == b1);
  CHECK(lay.slot_bytes == std::max(b0, b1));
  const gpu::QHostMat g4 = gpu::qrepack({q40.experts[0].gate, q40.experts[0].up}, "gu");
  const gpu::QWeight& gu = lay.layers[0].gu;
  CHECK(gu.format == g4.w.format);
  CHECK(gu.rows == E * 2 * I);
  CHECK(reinterpret_cast<uintptr_t>(gu.data) == 0);
  CHECK((gu.scales != nullptr) == !g4.scales.empty());
  CHECK(reinterpret_cast<uintptr_t>(gu.scales) == align256(g4.data.size() * E));
  char slot[16];
  const gpu::QWeight at = lay.layers[1].at(lay.layers[1].dn, slot);
  CHECK(static_cast<const char*>(at.data) == slot + reinterpret_cast<uintptr_t>(lay.layers[1].dn.data));
  CHECK(lay.format == std::string(gpu::qformat_name(g4.w.format)) + ", " +
                          gpu::qformat_name(gpu::qrepack({q50.experts[0].down}, "dn").w.format));
}

TEST_CASE("streamed slots fall back to bf16 for experts the GPU kernels do not take, or of mixed types, and when asked") {
  const ModelConfig c = config();
  const size_t bf16_slot = static_cast<size_t>(E) * 3 * static_cast<size_t>(I) * H * 2;
  StreamLayoutOptions o;
  o.skip_copies = true;
  Layer mixed;
  fill(mixed, 12, 12, 1, 8);  // expert 1's gate is Q8_0, the others Q4_K
  std::string why;
  CHECK(!experts_stream_quantized(mixed.experts, &why));
  CHECK_MESSAGE(why.find("expert 1") != std::string::npos, why);
  const StreamLayout m = build_stream_layout(c, {{3, &mixed.experts}}, o);
  CHECK(!m.quantized);
  CHECK(m.format == "bf16");
  CHECK(m.slot_bytes == bf16_slot);
  CHECK(m.down_off == static_cast<size_t>(E) * 2 * I * H * 2);
  CHECK_MESSAGE(m.why_image.find("layer 3") != std::string::npos, m.why_image);
  Layer plain;
  fill(plain, 0, 0);  // bf16 checkpoint
  CHECK(!experts_stream_quantized(plain.experts, &why));
  CHECK_MESSAGE(why.find("bf16") != std::string::npos, why);
  CHECK(!build_stream_layout(c, {{0, &plain.experts}}, o).quantized);
  Layer q4;
  fill(q4, 12, 12);
  o.quantized = false;  // --gpu-quantized-experts 0
  const StreamLayout asked = build_stream_layout(c, {{0, &q4.experts}}, o);
  CHECK(!asked.quantized);
  CHECK(asked.slot_bytes == bf16_slot);
  // A layer with the wrong expert count is an internal error naming it.
  Layer few;
  fill(few, 12, 12);
  few.experts.pop_back();
  o.quantized = true;
  std::string err;
  try {
    build_stream_layout(c, {{7, &few.experts}}, o);
  } catch (const Error& e) {
    err = e.what();
  }
  CHECK_MESSAGE(err.find("layer 7") != std::string::npos, err);
}
