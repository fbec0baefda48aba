#include "numa/expert_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "configs/error.h"
#include "configs/settings.h"

namespace hmoe::numa {

namespace {

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

// Rows per work item: 16 keeps the 4-row micro-kernels full and gives every
// thread many items even at one token.
constexpr int64_t kRowBlock = 16;
// GGUF 8-bit path: 32 rows per item, the tile kernels' row group (one
// repack feeds 2 x 16 rows of every token tile).
constexpr int64_t kGgufRows = 32;
// AMX experts: rows per phase-1 item (four 32-row strips dequantized once
// for all the expert's tokens) and per phase-2 item when any expert is AMX.
constexpr int64_t kAmxRows1 = 128, kAmxRows2 = 64;

// Boundaries of `parts` near-equal pieces of [0, total), on multiples of
// `align` where the total allows it.
std::vector<int64_t> split(int64_t total, int parts, int64_t align) {
  std::vector<int64_t> b(static_cast<size_t>(parts) + 1, 0);
  if (total < align * parts) align = 1;
  const int64_t units = (total + align - 1) / align;
  for (int j = 0; j <= parts; ++j) b[static_cast<size_t>(j)] = std::min(total, units * j / parts * align);
  b[static_cast<size_t>(parts)] = total;
  return b;
}

size_t align64(size_t v) { return (v + 63) & ~size_t{63}; }

// Bytes of a Mat's storage laid out as data | scales | zeros, each 64-aligned.
size_t placed_bytes(const cpu::Mat& m) {
  size_t b = align64(static_cast<size_t>(m.rows) * m.row_bytes());
  if (m.scales) b += align64(static_cast<size_t>(m.rows * m.groups()) * sizeof(float));
  if (m.zeros) b += align64(static_cast<size_t>(m.rows * m.groups()) * sizeof(float));
  return b;
}

// Copies m into dst (placed_bytes(m) long) and returns the view of the copy.
cpu::Mat place(const cpu::Mat& m, uint8_t* dst) {
  cpu::Mat out = m;
  const size_t data_bytes = static_cast<size_t>(m.rows) * m.row_bytes();
  if (data_bytes) std::memcpy(dst, m.data, data_bytes);
  out.data = dst;
  dst += align64(data_bytes);
  const size_t gbytes = static_cast<size_t>(m.rows * m.groups()) * sizeof(float);
  if (m.scales) {
    if (gbytes) std::memcpy(dst, m.scales, gbytes);
    out.scales = reinterpret_cast<const float*>(dst);
    dst += align64(gbytes);
  }
  if (m.zeros) {
    if (gbytes) std::memcpy(dst, m.zeros, gbytes);
    out.zeros = reinterpret_cast<const float*>(dst);
  }
  return out;
}

}  // namespace

EngineOptions EngineOptions::from_settings(const Settings& s) {
  EngineOptions o;
  o.bf16_dot = s.cpu_bf16_dot;
  o.emulate_gpu_act = s.cpu_emulate_gpu_bf16 && s.cpu_bf16_dot;
  o.gpu_split_act = s.gpu_hybrid_precise && s.gpu_hybrid_precise_act;
  o.int8_act = s.cpu_int8_act;
  o.gguf_int8 = s.cpu_gguf_int8;
  o.lowbit_repack = s.cpu_lowbit_repack;
  o.onednn_min_tokens = s.cpu_onednn_min_tokens;
  if (s.cpu_amx_min_tokens < 0)
    fail(ErrorKind::invalid_argument, "HMOE_CPU_AMX_MIN_TOKENS / --cpu-amx-min-tokens must be >= 0, got " + std::to_string(s.cpu_amx_min_tokens));
  o.amx_min_tokens = s.cpu_amx_min_tokens;
  o.print_memory = s.progress != "none";
  return o;
}

struct ExpertEngine::Scratch {
  std::vector<int64_t> count, offset;        // per expert
  std::vector<int32_t> active;               // experts with tokens, ascending
  std::vector<int64_t> pair_token;           // packed (expert-major) pairs -> token
  std::vector<float> pair_weight;
  std::vector<float> xs, act;                // [pairs, hidden], [pairs, inter]
  std::vector<uint16_t> xs_bf16;
  cpu::QActs xt, xq, aq;                     // int8_act: quantized tokens, xs and act
  cpu::Q8Acts gxt, gxq, gaq;                 // gguf_int8: the same for ggml block weights
  std::vector<int32_t> big;                  // oneDNN experts, ascending
  std::vector<int64_t> big_off;              // per big expert: first row in ybig
  std::vector<float> ybig, ubuf;             // [big pairs, hidden], [max m, inter]
  std::vector<uint16_t> abuf;                // [max m, inter] bf16
  std::vector<std::vector<int64_t>> items1;  // per node: (active index << 32) | row block
  std::vector<uint8_t> amx, pair_amx;        // per expert / per pair: through AMX tiles this step
  std::vector<int64_t> ablk;                 // per AMX expert: its first token block in ax / aa
  std::vector<int64_t> pack_items;           // (expert << 32) | token block, AMX experts
  cpu::AmxActs ax, aa;                       // bf16 tiles of the AMX experts' token rows and SwiGLU outputs
};

ExpertEngine::ExpertEngine(const std::vector<ExpertWeights>& experts, NodePools& pools, const EngineOptions& opt)
    : pools_(pools), opt_(opt), scratch_(std::make_unique<Scratch>()) {
  experts_ = static_cast<int64_t>(experts.size());
  if (experts_ == 0) fail(ErrorKind::invalid_argument, opt.name + ": no experts");
  inter_ = experts[0].gate.rows;
  hidden_ = experts[0].gate.cols;
  for (int64_t e = 0; e < experts_; ++e) {
    const auto& w = experts[static_cast<size_t>(e)];
    const std::string what = opt.name + " expert " + std::to_string(e);
    cpu::check_mat(w.gate, what + " gate");
    cpu::check_mat(w.up, what + " up");
    cpu::check_mat(w.down, what + " down");
    if (w.gate.rows != inter_ || w.gate.cols != hidden_ || w.up.rows != inter_ || w.up.cols != hidden_ || w.down.rows != hidden_ ||
        w.down.cols != inter_)
      fail(ErrorKind::invalid_argument, what + ": shapes differ from expert 0 (gate/up [" + std::to_string(inter_) + ", " +
                                            std::to_string(hidden_) + "], down [" + std::to_string(hidden_) + ", " + std::to_string(inter_) + "])");
    expert_bytes_.push_back(w.gate.bytes() + w.up.bytes() + w.down.bytes());
  }
  // The int8-activation path needs one quantization for all experts: the same
  // weight type (and group) everywhere.
  auto same_q = [&](auto get) {
    const cpu::Mat& m0 = get(experts[0]);
    if (!opt.int8_act || !cpu::int8_act_applies(m0)) return false;
    for (const auto& w : experts) {
      const cpu::Mat& m = get(w);
      if (m.quant != m0.quant || m.group != m0.group || !cpu::int8_act_applies(m)) return false;
    }
    return true;
  };
  q_up_ = same_q([](const ExpertWeights& w) -> const cpu::Mat& { return w.gate; }) &&
          same_q([](const ExpertWeights& w) -> const cpu::Mat& { return w.up; }) && experts[0].gate.quant == experts[0].up.quant &&
          experts[0].gate.group == experts[0].up.group;
  q_down_ = same_q([](const ExpertWeights& w) -> const cpu::Mat& { return w.down; });
  // The GGUF path: one ggml type (one activation layout) per projection.
  auto same_g = [&](auto get) {
    const cpu::Mat& m0 = get(experts[0]);
    if (!opt.gguf_int8 || !cpu::gguf_q8_applies(m0)) return false;
    for (const auto& w : experts)
      if (!cpu::gguf_q8_same_layout(get(w), m0)) return false;
    return true;
  };
  g_up_ = same_g([](const ExpertWeights& w) -> const cpu::Mat& { return w.gate; }) &&
          same_g([](const ExpertWeights& w) -> const cpu::Mat& { return w.up; }) &&
          cpu::gguf_q8_same_layout(experts[0].gate, experts[0].up);
  g_down_ = same_g([](const ExpertWeights& w) -> const cpu::Mat& { return w.down; });
  if (g_up_ || g_down_) (void)cpu::detail::q8_amx_mode();  // probe AMX-INT8 (once per process) here, not in the workers
  if (opt.onednn_min_tokens > 0) {
    bool all_bf16 = true;
    for (const auto& w : experts)
      for (const cpu::Mat* m : {&w.gate, &w.up, &w.down}) all_bf16 = all_bf16 && m->dtype == DType::bf16 && m->quant == cpu::Quant::none;
    if (all_bf16 && onednn_bf16_available()) onednn_ = std::make_unique<OnednnBf16>();
  }
  q_up_like_ = experts[0].gate;
  q_down_like_ = experts[0].down;
  const int nn = pools.nodes();
  inter_split_ = split(inter_, nn, kRowBlock);
  hidden_split_ = split(hidden_, nn, kRowBlock);
  copied_ = opt.copy_to_nodes == 1 || (opt.copy_to_nodes < 0 && nn > 1);
  slices_.assign(static_cast<size_t>(nn), std::vector<Slice>(static_cast<size_t>(experts_)));
  node_bytes_.assign(static_cast<size_t>(nn), 0);
  std::vector<std::vector<size_t>> offsets(static_cast<size_t>(nn));
  for (int j = 0; j < nn; ++j) {
    const int64_t i0 = inter_split_[static_cast<size_t>(j)], i1 = inter_split_[static_cast<size_t>(j) + 1];
    const int64_t h0 = hidden_split_[static_cast<size_t>(j)], h1 = hidden_split_[static_cast<size_t>(j) + 1];
    size_t off = 0;
    for (int64_t e = 0; e < experts_; ++e) {
      const auto& w = experts[static_cast<size_t>(e)];
      Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(e)];
      s.gate = w.gate.slice_rows(i0, i1);
      s.up = w.up.slice_rows(i0, i1);
      s.down = w.down.slice_rows(h0, h1);
      offsets[static_cast<size_t>(j)].push_back(off);
      off += placed_bytes(s.gate) + placed_bytes(s.up) + placed_bytes(s.down);
      node_bytes_[static_cast<size_t>(j)] += s.gate.bytes() + s.up.bytes() + s.down.bytes();
    }
    if (copied_) buffers_.emplace_back(off, pools.topology().nodes[static_cast<size_t>(j)].os_index, pools.membind());
  }
  if (copied_) {
    // Each node's workers copy (and so first-touch) their node's slices.
    pools.run(std::vector<int64_t>(static_cast<size_t>(nn), experts_), [&](int j, int64_t b, int64_t e_end, int) {
      for (int64_t e = b; e < e_end; ++e) {
        Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(e)];
        uint8_t* dst = buffers_[static_cast<size_t>(j)].data() + offsets[static_cast<size_t>(j)][static_cast<size_t>(e)];
        const cpu::Mat g = s.gate, u = s.up, d = s.down;
        s.gate = place(g, dst);
        dst += placed_bytes(g);
        s.up = place(u, dst);
        dst += placed_bytes(u);
        s.down = place(d, dst);
      }
    });
  }
  if (opt.lowbit_repack && (g_up_ || g_down_)) {
    // IQ1_S / IQ1_M slices repacked for the v5 kernel, each node's by its workers (first touch).
    auto gu = [&](const Slice& s) { return g_up_ && cpu::lowbit_repack_applies(s.gate) && cpu::lowbit_repack_applies(s.up); };
    auto dn = [&](const Slice& s) { return g_down_ && cpu::lowbit_repack_applies(s.down); };
    std::vector<std::vector<size_t>> poff(static_cast<size_t>(nn));
    std::vector<size_t> total(static_cast<size_t>(nn), 0);
    for (int j = 0; j < nn; ++j)
      for (int64_t e = 0; e < experts_; ++e) {
        const Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(e)];
        poff[static_cast<size_t>(j)].push_back(total[static_cast<size_t>(j)]);
        if (gu(s)) total[static_cast<size_t>(j)] += align64(cpu::lowbit_packed_bytes(s.gate)) + align64(cpu::lowbit_packed_bytes(s.up));
        if (dn(s)) total[static_cast<size_t>(j)] += align64(cpu::lowbit_packed_bytes(s.down));
      }
    if (std::any_of(total.begin(), total.end(), [](size_t b) { return b > 0; })) {
      packed_.assign(static_cast<size_t>(nn), std::vector<Packed>(static_cast<size_t>(experts_)));
      for (int j = 0; j < nn; ++j) {
        packed_buffers_.emplace_back(std::max<size_t>(total[static_cast<size_t>(j)], 64), pools.topology().nodes[static_cast<size_t>(j)].os_index,
                                     pools.membind());
        packed_bytes_ += total[static_cast<size_t>(j)];
      }
      pools.run(std::vector<int64_t>(static_cast<size_t>(nn), experts_), [&](int j, int64_t b, int64_t e_end, int) {
        for (int64_t e = b; e < e_end; ++e) {
          const Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(e)];
          Packed& p = packed_[static_cast<size_t>(j)][static_cast<size_t>(e)];
          uint8_t* dst = packed_buffers_[static_cast<size_t>(j)].data() + poff[static_cast<size_t>(j)][static_cast<size_t>(e)];
          if (gu(s)) {
            p.gate = cpu::lowbit_pack(s.gate, dst);
            dst += align64(cpu::lowbit_packed_bytes(s.gate));
            p.up = cpu::lowbit_pack(s.up, dst);
            dst += align64(cpu::lowbit_packed_bytes(s.up));
          }
          if (dn(s)) p.down = cpu::lowbit_pack(s.down, dst);
        }
      });
    }
  }
  if (opt.print_memory) std::fprintf(stderr, "hmoe: %s\n", memory_report().c_str());
}

ExpertEngine::~ExpertEngine() = default;

uint64_t ExpertEngine::expert_bytes(int64_t e) const { return expert_bytes_[static_cast<size_t>(e)]; }

const ExpertWeights& ExpertEngine::piece(int node, int64_t e) const {
  if (node < 0 || node >= static_cast<int>(slices_.size()) || e < 0 || e >= experts_)
    fail(ErrorKind::internal, opt_.name + ": no piece of expert " + std::to_string(e) + " on node " + std::to_string(node));
  return slices_[static_cast<size_t>(node)][static_cast<size_t>(e)];
}

std::vector<std::vector<ExpertWeights>> ExpertEngine::pieces() const {
  std::vector<std::vector<ExpertWeights>> out(static_cast<size_t>(experts_));
  for (int64_t e = 0; e < experts_; ++e)
    for (const auto& node : slices_) out[static_cast<size_t>(e)].push_back(node[static_cast<size_t>(e)]);
  return out;
}

std::vector<ExpertEngine::Buffer> ExpertEngine::buffers() const {
  std::vector<Buffer> out;
  for (const NodeBuffer& b : buffers_) out.push_back({b.data(), b.size()});
  return out;
}

std::string ExpertEngine::memory_report() const {
  std::ostringstream s;
  s << opt_.name << ": " << experts_ << " experts [" << hidden_ << " x " << inter_ << "], " << (copied_ ? "placed" : "viewed in place") << " on "
    << node_bytes_.size() << " node(s):";
  for (size_t j = 0; j < node_bytes_.size(); ++j) s << " node" << j << " " << std::fixed << std::setprecision(1) << node_bytes_[j] / 1048576.0 << " MiB";
  if (packed_bytes_) s << "; low-bit types repacked for the CPU kernel: " << std::fixed << std::setprecision(1) << packed_bytes_ / 1048576.0 << " MiB";
  return s.str();
}

void ExpertEngine::forward(const float* x, int64_t n, const int32_t* ids, const float* weights, int64_t k, float* out) {
  if (n <= 0 || k <= 0) return;
  Scratch& sc = *scratch_;
  const int64_t H = hidden_, I = inter_, P = n * k;
  // Group (token, slot) pairs by expert, expert-major, token order within.
  sc.count.assign(static_cast<size_t>(experts_), 0);
  for (int64_t p = 0; p < P; ++p) {
    if (ids[p] < 0 || ids[p] >= experts_)
      fail(ErrorKind::invalid_argument, opt_.name + ": expert id " + std::to_string(ids[p]) + " outside 0.." + std::to_string(experts_ - 1));
    ++sc.count[static_cast<size_t>(ids[p])];
  }
  sc.offset.assign(static_cast<size_t>(experts_) + 1, 0);
  sc.active.clear();
  for (int64_t e = 0; e < experts_; ++e) {
    sc.offset[static_cast<size_t>(e) + 1] = sc.offset[static_cast<size_t>(e)] + sc.count[static_cast<size_t>(e)];
    if (sc.count[static_cast<size_t>(e)]) sc.active.push_back(static_cast<int32_t>(e));
  }
  // Experts with enough tokens go through AMX tiles (GGUF weights, AMX CPU).
  const int64_t amin = opt_.amx_min_tokens >= 0 ? opt_.amx_min_tokens : cpu::amx_min_tokens();
  const bool amx_ok = g_up_ && g_down_ && amin > 0 && cpu::amx_applies(q_up_like_) && cpu::amx_applies(q_down_like_);
  sc.amx.assign(static_cast<size_t>(experts_), 0);
  sc.ablk.assign(static_cast<size_t>(experts_), 0);
  sc.pack_items.clear();
  bool any_amx = false, any_q8 = false;
  int64_t ablocks = 0;
  for (int32_t e : sc.active) {
    const int64_t m = sc.count[static_cast<size_t>(e)];
    if (!amx_ok || m < amin) {
      any_q8 = true;
      continue;
    }
    any_amx = true;
    sc.amx[static_cast<size_t>(e)] = 1;
    sc.ablk[static_cast<size_t>(e)] = ablocks;
    for (int64_t b = 0; b < (m + 15) / 16; ++b) sc.pack_items.push_back(static_cast<int64_t>(e) << 32 | b);
    ablocks += (m + 15) / 16;
  }
  if (any_amx) ++amx_steps_;
  sc.pair_token.resize(static_cast<size_t>(P));
  sc.pair_weight.resize(static_cast<size_t>(P));
  sc.pair_amx.resize(static_cast<size_t>(P));
  {
    std::vector<int64_t> fill(sc.offset.begin(), sc.offset.end() - 1);
    for (int64_t p = 0; p < P; ++p) {
      const int64_t slot = fill[static_cast<size_t>(ids[p])]++;
      sc.pair_token[static_cast<size_t>(slot)] = p / k;
      sc.pair_weight[static_cast<size_t>(slot)] = weights[p];
      sc.pair_amx[static_cast<size_t>(slot)] = sc.amx[static_cast<size_t>(ids[p])];
    }
  }
  // AMX experts' rows (pairs in token blocks of 16, padded): x now, act after phase 1.
  auto pack_amx = [&](cpu::AmxActs& dst, const float* src, int64_t width, bool by_token) {
    auto body = [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t item = sc.pack_items[static_cast<size_t>(i)];
        const auto ex = static_cast<size_t>(item >> 32);
        const int64_t blk = item & 0xffffffff, m = sc.count[ex], off = sc.offset[ex];
        for (int j = 0; j < 16; ++j) {
          const int64_t t = blk * 16 + j;
          const float* row = t >= m ? nullptr : by_token ? src + sc.pair_token[static_cast<size_t>(off + t)] * width : src + (off + t) * width;
          dst.set_row(sc.ablk[ex] + blk, j, row);
        }
      }
    };
    const auto ni = static_cast<int64_t>(sc.pack_items.size());
    if (ni > 1) pools_.pool(0).parallel_for(ni, body);
    else body(0, ni, 0);
  };
  if (any_amx) {
    sc.ax.reset(ablocks, H);
    sc.aa.reset(ablocks, I);
    pack_amx(sc.ax, x, H, true);
  }
  // Experts with many tokens go to oneDNN (bf16 weights only).
  sc.big.clear();
  if (onednn_) {
    std::vector<int32_t> small;
    for (int32_t e : sc.active) (sc.count[static_cast<size_t>(e)] >= opt_.onednn_min_tokens ? sc.big : small).push_back(e);
    sc.active.swap(small);
  }
  const bool bf16dot = opt_.bf16_dot && cpu::has_bf16_dot();
  // EngineOptions::emulate_gpu_act (the GPU's bf16 activation; only with the bf16 dot products that emulate its inputs).
  const bool round_act = bf16dot && opt_.emulate_gpu_act && (!opt_.gpu_split_act || (n > 64 && n * k >= 16 * experts_));
  const bool need_bf16 = bf16dot || !sc.big.empty();
  if (sc.xs.size() < static_cast<size_t>(P * H)) sc.xs.resize(static_cast<size_t>(P * H));
  if (sc.act.size() < static_cast<size_t>(P * I)) sc.act.resize(static_cast<size_t>(P * I));
  if (need_bf16 && sc.xs_bf16.size() < static_cast<size_t>(P * H)) sc.xs_bf16.resize(static_cast<size_t>(P * H));
  if (q_up_) {
    // Each token quantized once, then copied to its pairs by the gather.
    sc.xt.reset(n, q_up_like_);
    sc.xq.reset(P, q_up_like_);
    auto quant = [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) sc.xt.quantize(t, x + t * H);
    };
    if (n * H >= (1 << 16)) pools_.pool(0).parallel_for(n, quant, 4);
    else quant(0, n, 0);
  }
  if (g_up_ && any_q8) {
    sc.gxt.reset(n, q_up_like_);
    sc.gxq.reset(P, q_up_like_);
    auto quant = [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) sc.gxt.quantize(t, x + t * H);
    };
    if (n * H >= (1 << 16)) pools_.pool(0).parallel_for(n, quant, 4);
    else quant(0, n, 0);
  }
  if (q_down_) sc.aq.reset(P, q_down_like_);
  if (g_down_) sc.gaq.reset(P, q_down_like_);
  auto gather = [&](int64_t b, int64_t e, int) {
    for (int64_t p = b; p < e; ++p) {
      const float* src = x + sc.pair_token[static_cast<size_t>(p)] * H;
      if (q_up_) {
        sc.xq.copy_row(p, sc.xt, sc.pair_token[static_cast<size_t>(p)]);
        continue;
      }
      if (g_up_) {
        if (!sc.pair_amx[static_cast<size_t>(p)]) sc.gxq.copy_row(p, sc.gxt, sc.pair_token[static_cast<size_t>(p)]);
        continue;
      }
      std::memcpy(sc.xs.data() + p * H, src, static_cast<size_t>(H) * sizeof(float));
      if (need_bf16)
        for (int64_t h = 0; h < H; ++h) sc.xs_bf16[static_cast<size_t>(p * H + h)] = f32_to_bf16(src[h]);
    }
  };
  if (P * H >= (1 << 18)) pools_.pool(0).parallel_for(P, gather, 16);
  else gather(0, P, 0);

  const int nn = pools_.nodes();
  if (!sc.big.empty()) {
    // oneDNN experts, one after another on oneDNN's threads (the pools idle).
    ++onednn_steps_;
    int64_t rows = 0, max_m = 0;
    sc.big_off.clear();
    for (int32_t e : sc.big) {
      sc.big_off.push_back(rows);
      rows += sc.count[static_cast<size_t>(e)];
      max_m = std::max(max_m, sc.count[static_cast<size_t>(e)]);
    }
    if (sc.ybig.size() < static_cast<size_t>(rows * H)) sc.ybig.resize(static_cast<size_t>(rows * H));
    if (sc.ubuf.size() < static_cast<size_t>(max_m * I)) {
      sc.ubuf.resize(static_cast<size_t>(max_m * I));
      sc.abuf.resize(static_cast<size_t>(max_m * I));
    }
    for (size_t b = 0; b < sc.big.size(); ++b) {
      const int32_t ex = sc.big[b];
      const int64_t m = sc.count[static_cast<size_t>(ex)], off = sc.offset[static_cast<size_t>(ex)];
      const uint16_t* xb = sc.xs_bf16.data() + off * H;
      for (int j = 0; j < nn; ++j) {
        const Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(ex)];
        const int64_t i0 = inter_split_[static_cast<size_t>(j)];
        onednn_->matmul(xb, m, H, s.up, sc.ubuf.data() + i0, I);
        onednn_->matmul_swiglu(xb, m, H, s.gate, sc.ubuf.data() + i0, I, sc.abuf.data() + i0, I);
      }
      for (int j = 0; j < nn; ++j) {
        const Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(ex)];
        const int64_t h0 = hidden_split_[static_cast<size_t>(j)];
        onednn_->matmul(sc.abuf.data(), m, I, s.down, sc.ybig.data() + sc.big_off[b] * H + h0, H);
      }
    }
  }
  // Phase 1: act[pair, i] = silu(gate . x) * (up . x) for each node's i slice.
  sc.items1.resize(static_cast<size_t>(nn));
  std::vector<int64_t> n1(static_cast<size_t>(nn));
  for (int j = 0; j < nn; ++j) {
    auto& items = sc.items1[static_cast<size_t>(j)];
    items.clear();
    const int64_t rows = inter_split_[static_cast<size_t>(j) + 1] - inter_split_[static_cast<size_t>(j)];
    for (size_t a = 0; a < sc.active.size(); ++a) {
      const int64_t rb = sc.amx[static_cast<size_t>(sc.active[a])] ? kAmxRows1 : g_up_ ? kGgufRows : kRowBlock;
      for (int64_t b = 0; b < (rows + rb - 1) / rb; ++b) items.push_back(static_cast<int64_t>(a) << 32 | b);
    }
    n1[static_cast<size_t>(j)] = static_cast<int64_t>(items.size());
  }
  pools_.run(n1, [&](int j, int64_t b, int64_t e, int) {
    thread_local std::vector<float> g, u;
    for (int64_t it = b; it < e; ++it) {
      const int64_t item = sc.items1[static_cast<size_t>(j)][static_cast<size_t>(it)];
      const int32_t ex = sc.active[static_cast<size_t>(item >> 32)];
      const int64_t blk = item & 0xffffffff;
      const Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(ex)];
      const bool amx = sc.amx[static_cast<size_t>(ex)];
      const int64_t rb = amx ? kAmxRows1 : g_up_ ? kGgufRows : kRowBlock;
      const int64_t r0 = blk * rb, r1 = std::min(s.gate.rows, r0 + rb), nr = r1 - r0;
      const int64_t m = sc.count[static_cast<size_t>(ex)], off = sc.offset[static_cast<size_t>(ex)];
      if (g.size() < static_cast<size_t>(m * nr)) {
        g.resize(static_cast<size_t>(m * nr));
        u.resize(static_cast<size_t>(m * nr));
      }
      const cpu::Mat gs = s.gate.slice_rows(r0, r1), us = s.up.slice_rows(r0, r1);
      if (amx) {
        cpu::gemm_rows_amx(sc.ax, sc.ablk[static_cast<size_t>(ex)], m, gs, 0, nr, g.data(), nr);
        cpu::gemm_rows_amx(sc.ax, sc.ablk[static_cast<size_t>(ex)], m, us, 0, nr, u.data(), nr);
      } else if (q_up_) {
        cpu::gemm_rows_q(sc.xq, off, m, gs, 0, nr, g.data(), nr);
        cpu::gemm_rows_q(sc.xq, off, m, us, 0, nr, u.data(), nr);
      } else if (g_up_) {
        const Packed pk = packed_.empty() ? Packed{} : packed_[static_cast<size_t>(j)][static_cast<size_t>(ex)];
        cpu::lowbit_gemm_rows_q8_packed(sc.gxq, off, m, gs, pk.gate.from(r0), 0, nr, g.data(), nr);
        cpu::lowbit_gemm_rows_q8_packed(sc.gxq, off, m, us, pk.up.from(r0), 0, nr, u.data(), nr);
      } else if (bf16dot && gs.dtype == DType::bf16 && gs.quant == cpu::Quant::none) {
        cpu::gemm_rows_bf16dot(sc.xs_bf16.data() + off * H, H, m, gs, 0, nr, g.data(), nr);
        cpu::gemm_rows_bf16dot(sc.xs_bf16.data() + off * H, H, m, us, 0, nr, u.data(), nr);
      } else {
        cpu::gemm_rows(sc.xs.data() + off * H, H, m, gs, 0, nr, g.data(), nr);
        cpu::gemm_rows(sc.xs.data() + off * H, H, m, us, 0, nr, u.data(), nr);
      }
      const int64_t col0 = inter_split_[static_cast<size_t>(j)] + r0;
      for (int64_t t = 0; t < m; ++t) {
        float* dst = sc.act.data() + (off + t) * I + col0;
        for (int64_t i = 0; i < nr; ++i) dst[i] = silu(g[static_cast<size_t>(t * nr + i)]) * u[static_cast<size_t>(t * nr + i)];
        if (round_act)
          for (int64_t i = 0; i < nr; ++i) dst[i] = bf16_to_f32(f32_to_bf16(dst[i]));
      }
    }
  }, 1, 1);  // chunks of one item: a decode step is only ~20 items per thread

  // int8_act: quantize act once per pair (its groups span the nodes' slices).
  if (any_amx) pack_amx(sc.aa, sc.act.data(), I, false);
  if (q_down_ || (g_down_ && any_q8)) {
    auto quant = [&](int64_t b, int64_t e, int) {
      for (int64_t p = b; p < e; ++p) {
        if (q_down_) sc.aq.quantize(p, sc.act.data() + p * I);
        else if (!sc.pair_amx[static_cast<size_t>(p)]) sc.gaq.quantize(p, sc.act.data() + p * I);
      }
    };
    if (P * I >= (1 << 16)) pools_.pool(0).parallel_for(P, quant, 4);
    else quant(0, P, 0);
  }

  // Phase 2: out[token, h] += w * (down . act) for each node's h slice; one
  // item owns a block of hidden rows across all active experts.
  std::vector<int64_t> n2(static_cast<size_t>(nn));
  int64_t rb2 = any_amx ? kAmxRows2 : g_down_ ? kGgufRows : kRowBlock;
  if (g_down_ && !any_amx && P >= 8 * static_cast<int64_t>(sc.active.size())) {
    // Prompt steps (8+ tokens per expert on average): each (item, expert) packs the expert's activations
    // again for the panel kernels, so items grow to up to 256 rows while every worker keeps >= 4 of them.
    rb2 = 256;
    for (int j = 0; j < nn; ++j) {
      const int64_t rows = hidden_split_[static_cast<size_t>(j) + 1] - hidden_split_[static_cast<size_t>(j)];
      rb2 = std::min(rb2, std::max(kGgufRows, rows / (4 * pools_.pool(j).size()) / kGgufRows * kGgufRows));
    }
  }
  for (int j = 0; j < nn; ++j)
    n2[static_cast<size_t>(j)] = (hidden_split_[static_cast<size_t>(j) + 1] - hidden_split_[static_cast<size_t>(j)] + rb2 - 1) / rb2;
  pools_.run(n2, [&](int j, int64_t b, int64_t e, int) {
    thread_local std::vector<float> y;
    for (int64_t blk = b; blk < e; ++blk) {
      for (int32_t ex : sc.active) {
        const Slice& s = slices_[static_cast<size_t>(j)][static_cast<size_t>(ex)];
        const int64_t r0 = blk * rb2, r1 = std::min(s.down.rows, r0 + rb2), nr = r1 - r0;
        const int64_t m = sc.count[static_cast<size_t>(ex)], off = sc.offset[static_cast<size_t>(ex)];
        if (y.size() < static_cast<size_t>(m * nr)) y.resize(static_cast<size_t>(m * nr));
        if (sc.amx[static_cast<size_t>(ex)]) cpu::gemm_rows_amx(sc.aa, sc.ablk[static_cast<size_t>(ex)], m, s.down.slice_rows(r0, r1), 0, nr, y.data(), nr);
        else if (q_down_) cpu::gemm_rows_q(sc.aq, off, m, s.down.slice_rows(r0, r1), 0, nr, y.data(), nr);
        else if (g_down_)
          cpu::lowbit_gemm_rows_q8_packed(sc.gaq, off, m, s.down.slice_rows(r0, r1),
                                          packed_.empty() ? cpu::LowbitPacked{} : packed_[static_cast<size_t>(j)][static_cast<size_t>(ex)].down.from(r0), 0, nr,
                                          y.data(), nr);
        else cpu::gemm_rows(sc.act.data() + off * I, I, m, s.down.slice_rows(r0, r1), 0, nr, y.data(), nr);
        const int64_t h0 = hidden_split_[static_cast<size_t>(j)] + r0;
        for (int64_t t = 0; t < m; ++t) {
          const float wt = sc.pair_weight[static_cast<size_t>(off + t)];
          float* o = out + sc.pair_token[static_cast<size_t>(off + t)] * H + h0;
          for (int64_t i = 0; i < nr; ++i) o[i] += wt * y[static_cast<size_t>(t * nr + i)];
        }
      }
      // The oneDNN experts' outputs, in the same (ascending) order.
      const int64_t h0 = hidden_split_[static_cast<size_t>(j)] + blk * rb2;
      const int64_t nr = std::min(hidden_split_[static_cast<size_t>(j) + 1], h0 + rb2) - h0;
      for (size_t bi = 0; bi < sc.big.size(); ++bi) {
        const int32_t ex = sc.big[bi];
        const int64_t m = sc.count[static_cast<size_t>(ex)], off = sc.offset[static_cast<size_t>(ex)];
        for (int64_t t = 0; t < m; ++t) {
          const float wt = sc.pair_weight[static_cast<size_t>(off + t)];
          const float* yb = sc.ybig.data() + (sc.big_off[bi] + t) * H + h0;
          float* o = out + sc.pair_token[static_cast<size_t>(off + t)] * H + h0;
          for (int64_t i = 0; i < nr; ++i) o[i] += wt * yb[i];
        }
      }
    }
  }, 1, 1);
}

// ---- single-pool helpers ---------------------------------------------------------
void mlp_forward(const float* x, int64_t n, const ExpertWeights& w, float* out, ThreadPool* pool, const cpu::GemmOptions& o) {
  const int64_t inter = w.gate.rows;
  std::vector<float> g(static_cast<size_t>(n * inter)), u(static_cast<size_t>(n * inter));
  cpu::gemm(x, n, w.gate, g.data(), pool, o);
  cpu::gemm(x, n, w.up, u.data(), pool, o);
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  cpu::gemm(g.data(), n, w.down, out, pool, o);
}

void moe_forward(const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int64_t k,
                 const std::vector<ExpertWeights>& experts, float* out, ThreadPool* pool) {
  const int64_t E = static_cast<int64_t>(experts.size());
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = ids[t * k + j];
      if (id < 0 || id >= E) fail(ErrorKind::invalid_argument, "moe_forward: expert id " + std::to_string(id) + " outside 0.." + std::to_string(E - 1));
      by_expert[static_cast<size_t>(id)].push_back(t * k + j);
    }
  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (!by_expert[static_cast<size_t>(e)].empty()) active.push_back(e);
  // Each active expert computes its tokens into a private buffer; the sum
  // into `out` happens afterwards in a fixed order.
  std::vector<std::vector<float>> results(active.size());
  auto body = [&](int64_t b, int64_t e_end, int) {
    for (int64_t a = b; a < e_end; ++a) {
      const auto& w = experts[static_cast<size_t>(active[static_cast<size_t>(a)])];
      const auto& pairs = by_expert[static_cast<size_t>(active[static_cast<size_t>(a)])];
      const int64_t m = static_cast<int64_t>(pairs.size()), inter = w.gate.rows;
      std::vector<float> xs(static_cast<size_t>(m * hidden)), g(static_cast<size_t>(m * inter)), u(static_cast<size_t>(m * inter));
      for (int64_t i = 0; i < m; ++i) {
        const float* src = x + (pairs[static_cast<size_t>(i)] / k) * hidden;
        std::copy(src, src + hidden, xs.begin() + i * hidden);
      }
      cpu::gemm_rows(xs.data(), hidden, m, w.gate, 0, inter, g.data(), inter);
      cpu::gemm_rows(xs.data(), hidden, m, w.up, 0, inter, u.data(), inter);
      for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
      auto& r = results[static_cast<size_t>(a)];
      r.resize(static_cast<size_t>(m * hidden));
      cpu::gemm_rows(g.data(), inter, m, w.down, 0, hidden, r.data(), hidden);
    }
  };
  if (pool) pool->parallel_for(static_cast<int64_t>(active.size()), body);
  else body(0, static_cast<int64_t>(active.size()), 0);
  for (size_t a = 0; a < active.size(); ++a) {
    const auto& pairs = by_expert[static_cast<size_t>(active[a])];
    for (size_t i = 0; i < pairs.size(); ++i) {
      const int64_t t = pairs[i] / k;
      const float wt = weights[pairs[i]];
      const float* r = results[a].data() + static_cast<int64_t>(i) * hidden;
      float* o = out + t * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] += wt * r[h];
    }
  }
}

}  // namespace hmoe::numa
