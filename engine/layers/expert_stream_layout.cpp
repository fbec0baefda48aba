// Slot layouts and host sources of streamed MoE layers (see expert_stream_layout.h).
#include "engine/layers/expert_stream_layout.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "configs/error.h"
#include "engine/layers/gpu_upload.h"
#include "io/dtype.h"

namespace hmoe {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

bool plain_bf16(const cpu::Mat& m) { return m.dtype == DType::bf16 && m.quant == cpu::Quant::none; }
bool same_type(const cpu::Mat& a, const cpu::Mat& b) {
  return a.quant == b.quant && a.ext == b.ext && a.group == b.group && a.dtype == b.dtype && (a.zeros != nullptr) == (b.zeros != nullptr);
}

// Offsets of one stacked matrix's regions in a slot, from a template of one
// expert's rows (`per` rows of it) and the expert count.
struct Regions {
  size_t data = 0, scales = 0, zeros = 0, end = 0;
  size_t data_per = 0, scales_per = 0, zeros_per = 0;  // bytes per expert
};
Regions place(const gpu::QHostMat& one, int64_t E, size_t at) {
  Regions r;
  r.data_per = one.data.size();
  r.scales_per = one.scales.size() * sizeof(float);
  r.zeros_per = one.zeros.size() * sizeof(float);
  r.data = at;
  size_t p = align_up(at + r.data_per * static_cast<size_t>(E));
  r.scales = p;
  if (r.scales_per) p = align_up(p + r.scales_per * static_cast<size_t>(E));
  r.zeros = p;
  if (r.zeros_per) p = align_up(p + r.zeros_per * static_cast<size_t>(E));
  r.end = p;
  return r;
}
gpu::QWeight offsets_of(const gpu::QHostMat& one, const Regions& r, int64_t E) {
  gpu::QWeight w = one.w;
  w.rows = one.w.rows * E;
  w.data = reinterpret_cast<const void*>(r.data);
  w.scales = r.scales_per ? reinterpret_cast<const float*>(r.scales) : nullptr;
  w.zeros = r.zeros_per ? reinterpret_cast<const float*>(r.zeros) : nullptr;
  return w;
}

// The stored bytes of `parts` are the GPU layout as it is (no scales or zeros
// of its own, rows 16-byte multiples): compared on the repacked template.
bool stored_is_gpu(const gpu::QHostMat& one, const std::vector<cpu::Mat>& parts) {
  if (!one.scales.empty() || !one.zeros.empty() || one.w.stride() != one.w.row_bytes()) return false;
  size_t off = 0;
  for (const cpu::Mat& m : parts) {
    if (m.scales || m.zeros) return false;
    const size_t b = static_cast<size_t>(m.rows) * m.row_bytes();
    if (off + b > one.data.size() || std::memcmp(one.data.data() + off, m.data, b) != 0) return false;
    off += b;
  }
  return off == one.data.size();
}

std::vector<std::pair<uintptr_t, uintptr_t>> page_ranges(const std::vector<const cpu::Mat*>& mats) {
  const uintptr_t page = 4096;
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  for (const cpu::Mat* mt : mats) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(mt->data);
    r.push_back({a / page * page, (a + static_cast<size_t>(mt->rows) * mt->row_bytes() + page - 1) / page * page});
  }
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && x.first <= merged.back().second) merged.back().second = std::max(merged.back().second, x.second);
    else merged.push_back(x);
  }
  return merged;
}

bool pin_all(const std::vector<const cpu::Mat*>& mats, std::vector<gpu::HostRegistration>& pins, std::string* why, bool read_only_first) {
  for (const auto& x : page_ranges(mats)) {
    gpu::HostRegistration reg = gpu::HostRegistration::try_pin(reinterpret_cast<const void*>(x.first), x.second - x.first, why, read_only_first);
    if (!reg.ok()) {
      pins.clear();
      return false;
    }
    pins.push_back(std::move(reg));
  }
  return true;
}

// Expert e's matrix `which` (0 gate, 1 up, 2 down) as the row pieces that
// hold its bytes, in row order: the node pieces, or the whole matrix.
const cpu::Mat& pick(const numa::ExpertWeights& w, int which) { return which == 0 ? w.gate : which == 1 ? w.up : w.down; }
std::vector<const cpu::Mat*> rows_of(const StreamLayerSource& l, size_t e, int which) {
  if (!l.pieces) return {&pick((*l.experts)[e], which)};
  std::vector<const cpu::Mat*> out;
  for (const numa::ExpertWeights& p : (*l.pieces)[e])
    if (pick(p, which).rows > 0) out.push_back(&pick(p, which));
  return out;
}
std::vector<cpu::Mat> values(const std::vector<const cpu::Mat*>& v) {
  std::vector<cpu::Mat> out;
  for (const cpu::Mat* m : v) out.push_back(*m);
  return out;
}
size_t stored_bytes(const std::vector<const cpu::Mat*>& v) {
  size_t b = 0;
  for (const cpu::Mat* m : v) b += static_cast<size_t>(m->rows) * m->row_bytes();
  return b;
}

void finish_lists(StreamLayerLayout& l) {
  l.all.clear();
  for (auto& ops : l.by_expert) {
    coalesce_copies(ops);
    l.all.insert(l.all.end(), ops.begin(), ops.end());
  }
  coalesce_copies(l.all);
}

}  // namespace

void coalesce_copies(std::vector<StreamCopy>& ops) {
  std::sort(ops.begin(), ops.end(), [](const StreamCopy& a, const StreamCopy& b) { return a.dst < b.dst; });
  std::vector<StreamCopy> out;
  for (const StreamCopy& op : ops) {
    if (op.bytes == 0) continue;
    if (!out.empty() && out.back().dst + out.back().bytes == op.dst &&
        static_cast<const char*>(out.back().src) + out.back().bytes == static_cast<const char*>(op.src)) {
      out.back().bytes += op.bytes;
    } else {
      out.push_back(op);
    }
  }
  ops = std::move(out);
}

gpu::GgufWeight StreamLayerLayout::at(const gpu::GgufWeight& w, void* slot) const {
  gpu::GgufWeight r = w;
  r.data = static_cast<char*>(slot) + reinterpret_cast<uintptr_t>(w.data);
  return r;
}

gpu::QWeight StreamLayerLayout::at(const gpu::QWeight& w, void* slot) const {
  gpu::QWeight r = w;
  char* base = static_cast<char*>(slot);
  r.data = base + reinterpret_cast<uintptr_t>(w.data);
  r.scales = w.scales ? reinterpret_cast<const float*>(base + reinterpret_cast<uintptr_t>(w.scales)) : nullptr;
  r.zeros = w.zeros ? reinterpret_cast<const float*>(base + reinterpret_cast<uintptr_t>(w.zeros)) : nullptr;
  return r;
}

bool experts_stream_quantized(const std::vector<numa::ExpertWeights>& ex, std::string* why) {
  auto no = [&](const std::string& msg) {
    if (why) *why = msg;
    return false;
  };
  if (ex.empty()) return no("no experts");
  const numa::ExpertWeights& e0 = ex[0];
  // GGUF blocks the native kernels read as stored (the low-bit types have no
  // other GPU format) stream when the whole layer is of them.
  bool native = true;
  for (const numa::ExpertWeights& w : ex)
    native = native && gpu::gguf_native_supported(w.gate) && gpu::gguf_native_supported(w.up) && gpu::gguf_native_supported(w.down);
  for (size_t e = 0; e < ex.size(); ++e) {
    const numa::ExpertWeights& w = ex[e];
    for (const cpu::Mat* m : {&w.gate, &w.up, &w.down})
      if (!native && (m->quant == cpu::Quant::none || !gpu::qformat_supported(*m)))
        return no("expert " + std::to_string(e) + " has " + cpu::mat_type_name(*m) + " weights, which no GPU quantized kernel takes" +
                  (gpu::gguf_native_supported(*m) ? " (as stored only, and the layer's other experts are not all so)" : ""));
    if (!same_type(w.gate, e0.gate) || !same_type(w.up, e0.gate) || !same_type(w.down, e0.down))
      return no("expert " + std::to_string(e) + "'s matrices differ in type from expert 0's (" + cpu::mat_type_name(w.gate) + "/" +
                cpu::mat_type_name(w.up) + "/" + cpu::mat_type_name(w.down) + ")");
  }
  return true;
}

StreamLayout build_stream_layout(const ModelConfig& c, std::vector<StreamLayerSource> layers, const StreamLayoutOptions& o, numa::ThreadPool* pool) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
  std::sort(layers.begin(), layers.end(), [](const StreamLayerSource& a, const StreamLayerSource& b) { return a.layer < b.layer; });
  StreamLayout out;
  bool all_bf16 = true;
  out.quantized = o.quantized && !layers.empty();
  std::string why_bf16;
  for (const StreamLayerSource& l : layers) {
    if (static_cast<int64_t>(l.experts->size()) != E || (l.pieces && static_cast<int64_t>(l.pieces->size()) != E))
      fail(ErrorKind::internal, "expert stream: layer " + std::to_string(l.layer) + " has the wrong expert count");
    if (l.pieces)
      for (size_t e = 0; e < l.pieces->size(); ++e)
        for (int which = 0; which < 3; ++which) {
          int64_t rows = 0;
          for (const cpu::Mat* m : rows_of(l, e, which)) {
            if (!same_type(*m, pick((*l.experts)[e], which)) || m->cols != pick((*l.experts)[e], which).cols)
              fail(ErrorKind::internal, "expert stream: layer " + std::to_string(l.layer) + " expert " + std::to_string(e) + ": a node piece differs in type or width");
            rows += m->rows;
          }
          if (rows != pick((*l.experts)[e], which).rows)
            fail(ErrorKind::internal, "expert stream: layer " + std::to_string(l.layer) + " expert " + std::to_string(e) + ": node pieces do not cover the rows");
        }
    for (const auto& e : *l.experts) {
      if (e.gate.rows != I || e.up.rows != I || e.gate.cols != H || e.up.cols != H || e.down.rows != H || e.down.cols != I)
        fail(ErrorKind::internal, "expert stream: layer " + std::to_string(l.layer) + " experts differ from the model's shapes");
      all_bf16 = all_bf16 && plain_bf16(e.gate) && plain_bf16(e.up) && plain_bf16(e.down);
    }
    if (out.quantized && !experts_stream_quantized(*l.experts, &why_bf16)) {
      out.quantized = false;
      why_bf16 = "layer " + std::to_string(l.layer) + ": " + why_bf16;
    }
  }
  out.layers.resize(layers.size());
  // What pinning in place would register: the bytes of the sources their owner did not register.
  std::vector<const cpu::Mat*> mats;
  bool all_registered = !layers.empty(), any_pieces = false;
  for (const StreamLayerSource& l : layers) {
    all_registered = all_registered && l.registered;
    any_pieces = any_pieces || l.pieces;
    if (l.registered) continue;
    for (size_t e = 0; e < l.experts->size(); ++e)
      for (int which = 0; which < 3; ++which)
        for (const cpu::Mat* mt : rows_of(l, e, which)) mats.push_back(mt);
  }
  // A file map (no pieces) is read-only: registered with the read-only flag first.
  const bool read_only_first = !any_pieces;

  if (!out.quantized) {
    // bf16 slots: [E][2I][H] then [E][H][I].
    const size_t mat_gu = static_cast<size_t>(I * H) * 2, mat_dn = static_cast<size_t>(H * I) * 2;
    out.slot_bytes = static_cast<size_t>(E) * (2 * mat_gu + mat_dn);
    out.down_off = static_cast<size_t>(E) * 2 * mat_gu;
    out.format = "bf16";
    out.in_place = !o.skip_copies && !o.force_image && all_bf16;
    out.why_image = all_bf16 ? "" : (why_bf16.empty() ? "experts are not plain bf16" : why_bf16);
    if (o.force_image) out.why_image = "a copy was asked for";
    if (out.in_place && !mats.empty() && !o.pin_in_place) out.pageable = true;
    else if (out.in_place && !mats.empty() && !pin_all(mats, out.pins, &out.why_image, read_only_first)) out.in_place = false;
    out.registered = out.in_place && all_registered;
    for (size_t j = 0; j < layers.size(); ++j) {
      StreamLayerLayout& l = out.layers[j];
      l.layer = layers[j].layer;
      l.bytes = out.slot_bytes;
      l.by_expert.resize(static_cast<size_t>(E));
      const bool image = !out.in_place && !o.skip_copies;
      if (image) {
        l.image = gpu::PinnedBuffer(out.slot_bytes);
        out.image_bytes += out.slot_bytes;
      }
      for (int64_t e = 0; e < E; ++e) {
        const auto eu = static_cast<size_t>(e);
        const size_t gu_off = eu * 2 * mat_gu, dn_off = out.down_off + eu * mat_dn;
        const size_t at[3] = {gu_off, gu_off + mat_gu, dn_off};
        std::vector<StreamCopy>& ops = l.by_expert[eu];
        for (int which = 0; which < 3; ++which) {
          size_t dst = at[which];
          for (const cpu::Mat* m : rows_of(layers[j], eu, which)) {
            const size_t bytes = static_cast<size_t>(m->rows * m->cols) * 2;
            if (image) {
              char* base = l.image.as<char>();
              write_bf16(*m, reinterpret_cast<uint16_t*>(base + dst));
              ops.push_back({dst, base + dst, bytes});
            } else {
              ops.push_back({dst, m->data, bytes});
            }
            dst += bytes;
          }
        }
      }
      finish_lists(l);
    }
    return out;
  }

  // Quantized slots. Templates from each layer's expert 0 decide the
  // regions and, per stacked matrix, whether the stored bytes are the GPU's
  // (then pinned in place) or need a pinned image of their region.
  const size_t N = layers.size();
  std::vector<gpu::QHostMat> gu0(N), dn0(N);
  std::vector<char> gu_direct(N, 0), dn_direct(N, 0);
  std::string why_image = o.force_image ? "a copy was asked for" : "";
  std::string fmt;
  bool all_direct = true;
  std::vector<const cpu::Mat*> direct_mats;
  std::vector<char> nat(N, 0);
  // The bytes of layer j's experts `which` go into direct_mats (to be pinned) unless their owner registered them.
  auto add_direct = [&](size_t j, std::initializer_list<int> which) {
    if (layers[j].registered) return;
    for (size_t e = 0; e < layers[j].experts->size(); ++e)
      for (int x : which)
        for (const cpu::Mat* m : rows_of(layers[j], e, x)) direct_mats.push_back(m);
  };
  for (size_t j = 0; j < N; ++j) {
    const numa::ExpertWeights& w = (*layers[j].experts)[0];
    const std::string what = "layer " + std::to_string(layers[j].layer) + " streamed experts";
    nat[j] = true;
    for (const auto& e : *layers[j].experts)
      nat[j] = nat[j] && gpu::gguf_native_supported(e.gate) && gpu::gguf_native_supported(e.up) && gpu::gguf_native_supported(e.down);
    if (nat[j]) {
      gu_direct[j] = dn_direct[j] = !o.force_image;
      if (!o.force_image) add_direct(j, {0, 1, 2});
      const std::string a = gpu::gguf_type_name(gpu::gguf_type_of(w.gate, what)), b = gpu::gguf_type_name(gpu::gguf_type_of(w.down, what));
      const std::string f = a == b ? a : a + " / " + b;
      if ((", " + fmt + ", ").find(", " + f + ", ") == std::string::npos) fmt += (fmt.empty() ? "" : ", ") + f;
      all_direct = all_direct && gu_direct[j] && dn_direct[j];
      continue;
    }
    std::vector<cpu::Mat> gu_parts = values(rows_of(layers[j], 0, 0));
    for (const cpu::Mat* m : rows_of(layers[j], 0, 1)) gu_parts.push_back(*m);
    const std::vector<cpu::Mat> dn_parts = values(rows_of(layers[j], 0, 2));
    gu0[j] = gpu::qrepack(gu_parts, what + " gate/up");
    dn0[j] = gpu::qrepack(dn_parts, what + " down");
    gu_direct[j] = !o.force_image && stored_is_gpu(gu0[j], gu_parts);
    dn_direct[j] = !o.force_image && stored_is_gpu(dn0[j], dn_parts);
    if (!o.force_image && (!gu_direct[j] || !dn_direct[j]) && why_image.empty())
      why_image = "layer " + std::to_string(layers[j].layer) + "'s " + cpu::mat_type_name(gu_direct[j] ? w.down : w.gate) +
                  " experts are held in the GPU's own layout (repacked once here)";
    all_direct = all_direct && gu_direct[j] && dn_direct[j];
    if (gu_direct[j]) add_direct(j, {0, 1});
    if (dn_direct[j]) add_direct(j, {2});
    const std::string a = gpu::qformat_name(gu0[j].w.format), b = gpu::qformat_name(dn0[j].w.format);
    const std::string f = a == b ? a : a + " / " + b;
    if ((", " + fmt + ", ").find(", " + f + ", ") == std::string::npos) fmt += (fmt.empty() ? "" : ", ") + f;
  }
  out.format = fmt;
  out.stored_blocks = all_direct;
  // Pin the stored blocks (when asked); a refusal puts every region into
  // images. Not asked: the stored blocks are read as pageable memory.
  std::string why_pin;
  const bool try_pin = !o.skip_copies && !direct_mats.empty() && o.pin_in_place;
  // Nothing left to pin (every source registered by its owner) counts as pinned.
  const bool pinned = direct_mats.empty() ? !o.skip_copies : try_pin && pin_all(direct_mats, out.pins, &why_pin, read_only_first);
  out.pageable = !o.skip_copies && !direct_mats.empty() && !o.pin_in_place;
  if (try_pin && !pinned) {
    std::fill(gu_direct.begin(), gu_direct.end(), 0);
    std::fill(dn_direct.begin(), dn_direct.end(), 0);
    why_image = "the driver did not pin the stored blocks: " + why_pin;
  }
  out.in_place = (pinned || out.pageable) && all_direct;
  out.registered = out.in_place && all_registered;
  out.why_image = out.in_place ? "" : why_image;
  for (size_t j = 0; j < N; ++j) {
    StreamLayerLayout& l = out.layers[j];
    l.layer = layers[j].layer;
    Regions rg, rd;
    if (nat[j]) {  // stored blocks: data only, 16 readable bytes after each region
      const numa::ExpertWeights& w = (*layers[j].experts)[0];
      const std::string what = "layer " + std::to_string(l.layer) + " streamed experts";
      l.native = true;
      l.ngu = gpu::GgufWeight{gpu::gguf_type_of(w.gate, what), nullptr, E * 2 * I, H};
      l.ndn = gpu::GgufWeight{gpu::gguf_type_of(w.down, what), nullptr, E * H, I};
      rg.data_per = static_cast<size_t>(2 * I) * l.ngu.row_bytes();
      rg.end = align_up(rg.data_per * static_cast<size_t>(E) + 16);
      rd.data = rd.scales = rd.zeros = rg.end;
      rd.data_per = static_cast<size_t>(H) * l.ndn.row_bytes();
      rd.end = align_up(rd.data + rd.data_per * static_cast<size_t>(E) + 16);
      l.ngu.data = reinterpret_cast<const void*>(rg.data);
      l.ndn.data = reinterpret_cast<const void*>(rd.data);
    } else {
      rg = place(gu0[j], E, 0);
      rd = place(dn0[j], E, rg.end);
      l.gu = offsets_of(gu0[j], rg, E);
      l.dn = offsets_of(dn0[j], rd, E);
    }
    l.bytes = rd.end;
    out.slot_bytes = std::max(out.slot_bytes, l.bytes);
    l.by_expert.resize(static_cast<size_t>(E));
    if (o.skip_copies) continue;
    // The image covers the regions that are not pinned in place: [lo, hi) of the slot.
    const size_t lo = gu_direct[j] ? rg.end : 0, hi = dn_direct[j] ? rg.end : rd.end;
    if (hi > lo) {
      l.image = gpu::PinnedBuffer(hi - lo);
      std::memset(l.image.as<char>(), 0, hi - lo);
      out.image_bytes += hi - lo;
    }
    char* img = hi > lo ? l.image.as<char>() - lo : nullptr;  // indexed by slot offset
    // One expert per item: repacks are independent (their own ops list, disjoint image bytes).
    auto one_expert = [&](int64_t e) {
      const size_t eu = static_cast<size_t>(e);
      const std::vector<const cpu::Mat*> gate = rows_of(layers[j], eu, 0), up = rows_of(layers[j], eu, 1), down = rows_of(layers[j], eu, 2);
      std::vector<StreamCopy>& ops = l.by_expert[eu];
      const std::string what = "layer " + std::to_string(l.layer) + " expert " + std::to_string(e);
      auto put = [&](const void* src, size_t dst, size_t bytes) {
        if (bytes == 0) return;
        std::memcpy(img + dst, src, bytes);
        ops.push_back({dst, img + dst, bytes});
      };
      auto same = [&](const gpu::QHostMat& h, const gpu::QHostMat& t, const Regions& r) {
        if (h.data.size() != r.data_per || h.scales.size() * 4 != r.scales_per || h.zeros.size() * 4 != r.zeros_per || h.w.format != t.w.format ||
            h.w.group != t.w.group)
          fail(ErrorKind::internal, "expert stream: " + what + " repacks to another layout than expert 0");
      };
      // Stored rows, piece by piece (node pieces follow each other in row order): read in place, or into the image as they are.
      auto stored = [&](const std::vector<const cpu::Mat*>& rows, size_t dst, bool direct) {
        for (const cpu::Mat* m : rows) {
          const size_t b = static_cast<size_t>(m->rows) * m->row_bytes();
          if (direct) ops.push_back({dst, m->data, b});
          else put(m->data, dst, b);
          dst += b;
        }
      };
      if (gu_direct[j] || l.native) {
        const size_t g = stored_bytes(gate), u = stored_bytes(up);
        if (g + u != rg.data_per) fail(ErrorKind::internal, "expert stream: " + what + " gate/up differ in size from expert 0's");
        stored(gate, rg.data + eu * rg.data_per, gu_direct[j]);
        stored(up, rg.data + eu * rg.data_per + g, gu_direct[j]);
      } else {
        std::vector<cpu::Mat> parts = values(gate);
        for (const cpu::Mat* m : up) parts.push_back(*m);
        const gpu::QHostMat h = gpu::qrepack(parts, what + " gate/up");
        same(h, gu0[j], rg);
        put(h.data.data(), rg.data + eu * rg.data_per, rg.data_per);
        put(h.scales.data(), rg.scales + eu * rg.scales_per, rg.scales_per);
        put(h.zeros.data(), rg.zeros + eu * rg.zeros_per, rg.zeros_per);
      }
      if (dn_direct[j] || l.native) {
        if (stored_bytes(down) != rd.data_per) fail(ErrorKind::internal, "expert stream: " + what + " down differs in size from expert 0's");
        stored(down, rd.data + eu * rd.data_per, dn_direct[j]);
      } else {
        const gpu::QHostMat h = gpu::qrepack(values(down), what + " down");
        same(h, dn0[j], rd);
        put(h.data.data(), rd.data + eu * rd.data_per, rd.data_per);
        put(h.scales.data(), rd.scales + eu * rd.scales_per, rd.scales_per);
        put(h.zeros.data(), rd.zeros + eu * rd.zeros_per, rd.zeros_per);
      }
    };
    if (pool && hi > lo) {
      pool->parallel_for(E, [&](int64_t b, int64_t e_end, int) {
        for (int64_t e = b; e < e_end; ++e) one_expert(e);
      });
    } else {
      for (int64_t e = 0; e < E; ++e) one_expert(e);
    }
    finish_lists(l);
    if (hi > lo) {  // the image's regions, gaps included, as one copy; the pinned stored blocks as they coalesce
      std::vector<StreamCopy> all;
      for (const StreamCopy& op : l.all)
        if (op.dst + op.bytes <= lo || op.dst >= hi) all.push_back(op);
      all.push_back({lo, l.image.as<char>(), hi - lo});
      coalesce_copies(all);
      l.all = std::move(all);
    }
  }
  return out;
}

}  // namespace hmoe
