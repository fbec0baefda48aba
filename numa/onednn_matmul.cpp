#include "numa/onednn_matmul.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <vector>

#include "configs/error.h"

namespace hmoe::numa {

namespace {
using dt = dnnl::memory::data_type;
using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;  // kind, m, n, k, ldx, ldy, ldu
}  // namespace

struct OnednnBf16::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::map<Key, std::pair<dnnl::matmul, dnnl::memory::desc>> prims;  // primitive, its weights desc

  std::pair<dnnl::matmul, dnnl::memory::desc>& get(int kind, int64_t m, int64_t n, int64_t k, int64_t ldx, int64_t ldy, int64_t ldu) {
    const Key key{kind, m, n, k, ldx, ldy, ldu};
    auto it = prims.find(key);
    if (it != prims.end()) return it->second;
    dnnl::memory::desc a({m, k}, dt::bf16, {ldx, 1}), w({k, n}, dt::bf16, {1, k});
    dnnl::memory::desc c = kind == 0 ? dnnl::memory::desc({m, n}, dt::f32, {ldy, 1}) : dnnl::memory::desc({m, n}, dt::bf16, {ldy, 1});
    dnnl::primitive_attr attr;
    if (kind == 1) {
      dnnl::post_ops po;
      po.append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);  // x * sigmoid(1 * x) = silu
      po.append_binary(dnnl::algorithm::binary_mul, dnnl::memory::desc({m, n}, dt::f32, {ldu, 1}));
      attr.set_post_ops(po);
    }
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, w, c), attr, eng);
      return prims.emplace(key, std::make_pair(dnnl::matmul(pd), w)).first->second;
    } catch (const dnnl::error& e) {
      fail(ErrorKind::unsupported, std::string("oneDNN bf16 matmul ") + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ": " + e.what());
    }
  }

  void run(int kind, const uint16_t* xb, int64_t m, int64_t ldx, const cpu::Mat& w, void* y, int64_t ldy, const float* u, int64_t ldu) {
    if (w.dtype != DType::bf16 || w.quant != cpu::Quant::none) fail(ErrorKind::invalid_argument, "oneDNN bf16 matmul: weights are " + cpu::mat_type_name(w));
    const int64_t n = w.rows, k = w.cols;
    auto& [prim, wmd] = get(kind, m, n, k, ldx, ldy, ldu);
    dnnl::memory a({{m, k}, dt::bf16, {ldx, 1}}, eng, const_cast<uint16_t*>(xb));
    dnnl::memory b(wmd, eng, const_cast<void*>(w.data));
    dnnl::memory c(kind == 0 ? dnnl::memory::desc({m, n}, dt::f32, {ldy, 1}) : dnnl::memory::desc({m, n}, dt::bf16, {ldy, 1}), eng, y);
    if (kind == 1) {
      dnnl::memory um({{m, n}, dt::f32, {ldu, 1}}, eng, const_cast<float*>(u));
      prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1, um}});
    } else {
      prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    }
    strm.wait();
  }
};

OnednnBf16::OnednnBf16() : impl_(std::make_unique<Impl>()) {}
OnednnBf16::~OnednnBf16() = default;
size_t OnednnBf16::primitives() const { return impl_->prims.size(); }

void OnednnBf16::matmul(const uint16_t* xb, int64_t m, int64_t ldx, const cpu::Mat& w, float* y, int64_t ldy) {
  if (m > 0 && w.rows > 0) impl_->run(0, xb, m, ldx, w, y, ldy, nullptr, 0);
}

void OnednnBf16::matmul_swiglu(const uint16_t* xb, int64_t m, int64_t ldx, const cpu::Mat& w, const float* u, int64_t ldu, uint16_t* yb, int64_t ldy) {
  if (m > 0 && w.rows > 0) impl_->run(1, xb, m, ldx, w, yb, ldy, u, ldu);
}

bool onednn_bf16_available() {
  static const bool ok = [] {
    try {
      OnednnBf16 mm;
      const int64_t m = 2, n = 16, k = 32;
      std::vector<uint16_t> w(static_cast<size_t>(n * k), 0x3f80), x(static_cast<size_t>(m * k), 0x3f80), yb(static_cast<size_t>(m * n));
      std::vector<float> y(static_cast<size_t>(m * n)), u(static_cast<size_t>(m * n), 1.0f);
      const cpu::Mat wm{DType::bf16, w.data(), n, k};
      mm.matmul(x.data(), m, k, wm, y.data(), n);
      mm.matmul_swiglu(x.data(), m, k, wm, u.data(), n, yb.data(), n);
      return y[0] == static_cast<float>(k);  // 1 x 1 summed over k
    } catch (const std::exception&) {
      return false;
    }
  }();
  return ok;
}

double onednn_bf16_gflops(int64_t m, int64_t n, int64_t k, int reps) {
  if (!onednn_bf16_available()) return 0;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  dnnl::memory::desc a_md({m, k}, dt::bf16, dnnl::memory::format_tag::ab), w_any({k, n}, dt::bf16, dnnl::memory::format_tag::any),
      c_md({m, n}, dt::f32, dnnl::memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_any, c_md), eng);
  dnnl::matmul prim(pd);
  std::vector<uint16_t> xa(static_cast<size_t>(m * k), 0x3f80);  // 1.0
  std::vector<float> y(static_cast<size_t>(m * n));
  dnnl::memory a(a_md, eng, xa.data()), b(pd.weights_desc(), eng), c(c_md, eng, y.data());
  std::fill_n(static_cast<uint16_t*>(b.get_data_handle()), pd.weights_desc().get_size() / 2, uint16_t{0x3c00});  // 2^-7
  auto run = [&] {
    prim.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    strm.wait();
  };
  run();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / best / 1e9;
}

}  // namespace hmoe::numa
