// The copy residence of host experts (engine/layers/host_residence.h) on the
// CPU side, without a GPU: RoutedExperts copies a GGUF layer's experts into
// the expert engine's node memory (one node and two), its CPU outputs are
// bit for bit those of the engine that views the file map (Q8_0 fixture,
// Q4_K, Q6_K and a low-bit type), the checkpoint's pages of the copied
// experts leave the process (the page table, /proc/self/pagemap) and stay
// out through the load's touch, the views still read right afterwards,
// and the stream layout built over the node pieces copies each expert's
// rows from its pieces into the right slot bytes with no image; experts in
// the loader's own buffers (no file map) are not copied but registered
// where they are. Plus the setting's values, its aliases and the memory
// fallback.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "configs/error.h"
#include "configs/settings.h"
#include "engine/layers/expert_stream_layout.h"
#include "engine/layers/host_residence.h"
#include "engine/layers/routed_experts.h"
#include "engine/layers/weights.h"
#include "engine/loading/gguf_model.h"
#include "io/dtype.h"
#include "numa/quant_gguf.h"
#include "tests/quant_tools/gguf_models.h"
#include "tests/quant_tools/lowbit_blocks.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

// Pages of [p, p + bytes) (whole pages inside it) present in this process's page table.
int64_t present_pages(const void* p, size_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page, b = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  REQUIRE(fd >= 0);
  int64_t n = 0;
  for (uintptr_t x = a; x < b; x += page) {
    uint64_t e = 0;
    REQUIRE(::pread(fd, &e, 8, static_cast<off_t>(x / page * 8)) == 8);
    n += (e >> 63) & 1;
  }
  ::close(fd);
  return n;
}

std::string write_model(const test::TempDir& d, const std::string& name, uint32_t type, uint32_t lowbit = 0) {
  qtools::Built b = qtools::build_model(type);
  if (lowbit) {  // the expert tensors in a low-bit type (random blocks of the format; no quantizer of these types here)
    uint64_t seed = 7;
    for (auto& t : b.quant.tensors())
      if (t.name.find("_exps.weight") != std::string::npos) {
        const int64_t cols = static_cast<int64_t>(t.shape[0]), rows = static_cast<int64_t>(t.shape[1] * t.shape[2]);
        t.type = lowbit;
        t.bytes = qtools::lowbit_random_rows(static_cast<cpu::ExtType>(lowbit), rows, cols, ++seed, 0.05f);
      }
  }
  const std::string p = d.str() + "/" + name;
  test::write_file(p, b.quant.bytes());
  // Written back, as a downloaded checkpoint is: the page cache can then let its pages go (dirty ones stay
  // until written back, and the kernel's fault-around maps cached neighbours of any page read).
  const int fd = ::open(p.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ::fdatasync(fd);
  ::close(fd);
  return p;
}

numa::PoolOptions pool_options(int nodes) {
  numa::PoolOptions o;
  o.threads = 2;
  o.topology = nodes == 2 ? "numa:2 core:1 pu:1" : "numa:1 core:2 pu:1";
  o.binding = numa::Binding::none;
  o.quiet = true;
  return o;
}

// out = the layer's routed experts on n random tokens, top-2 of 4 experts.
std::vector<float> run(RoutedExperts& r, int64_t n, int64_t H) {
  const auto x = test::random_floats(static_cast<size_t>(n * H), 31, 1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(n * 2));
  std::vector<float> w(ids.size());
  for (int64_t t = 0; t < n; ++t) {
    ids[static_cast<size_t>(2 * t)] = static_cast<int32_t>(t % 4);
    ids[static_cast<size_t>(2 * t + 1)] = static_cast<int32_t>((t * 3 + 1) % 4);
    w[static_cast<size_t>(2 * t)] = 0.6f;
    w[static_cast<size_t>(2 * t + 1)] = 0.4f;
  }
  std::vector<float> out(static_cast<size_t>(n * H), 0.0f);
  r.run_host(x.data(), n, ids.data(), w.data(), 2, out.data());
  return out;
}

struct Case {
  std::string label, path;
};

}  // namespace

TEST_CASE("copy residence: node pieces compute bit for bit as the file map's views; the file's pages leave the process and the views still read right") {
  test::TempDir dir("host-residence");
  std::vector<Case> cases = {{"Q8_0 fixture", test::fixture_ref("tiny-qwen3moe-Q8_0.gguf")},
                             {"Q4_K", write_model(dir, "q4k.gguf", 12)},
                             {"Q6_K", write_model(dir, "q6k.gguf", 14)},
                             {"IQ4_XS experts", write_model(dir, "iq4xs.gguf", 8, 23)}};
  for (const Case& k : cases)
    for (int nodes : {1, 2}) {
      CAPTURE(k.label);
      CAPTURE(nodes);
      ModelConfig c;
      std::unique_ptr<WeightSource> src = open_gguf_source(k.path, c);
      WeightBinder bind(nullptr, src.get());
      numa::NodePools pools(pool_options(nodes));
      const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.num_experts;
      const std::string prefix = "model.layers.0.mlp.";
      ExpertHomeOptions copy_opt;
      copy_opt.engine.print_memory = false;
      copy_opt.residence = HostResidence::copy;
      HostResidenceStats st;
      copy_opt.residence_stats = &st;
      RoutedExperts copied(bind, c, 0, prefix, RoutedExperts::Home::host, pools, copy_opt);
      // The stats: every byte copied and dropped (a file map), none kept; no CUDA here, so no registration.
      uint64_t expert_bytes = 0;
      for (const auto& w : copied.host_weights()) expert_bytes += w.gate.bytes() + w.up.bytes() + w.down.bytes();
      CHECK(st.layers == 1);
      CHECK(st.copied_bytes >= expert_bytes);
      CHECK(st.dropped_bytes == expert_bytes);
      CHECK(st.in_place_layers == 0);
      CHECK(st.registered_bytes == 0);
      CHECK_FALSE(st.refused.empty());  // "not built with CUDA"
      CHECK_FALSE(copied.host_registered());
      // The file map's pages of the layer's experts: out of this process (checked before anything below reads
      // the views again), and marked so that the load's touch does not read them. (After the touch a few may be
      // mapped again by the kernel's fault-around from the neighbouring tensors it reads, where the page cache
      // still holds them: large folios that straddle a tensor boundary.)
      const numa::ExpertWeights& w0 = copied.host_weights()[0];
      const size_t gate_all = static_cast<size_t>(E) * w0.gate.bytes(), page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      CHECK(present_pages(w0.gate.data, gate_all) == 0);
      const uintptr_t g0 = (reinterpret_cast<uintptr_t>(w0.gate.data) + page - 1) / page * page;
      int64_t marked = 0, inner = 0;
      for (uintptr_t a = g0; a + page <= reinterpret_cast<uintptr_t>(w0.gate.data) + gate_all; a += page, ++inner)
        marked += src->dropped(reinterpret_cast<const void*>(a));
      CHECK(inner > 0);
      CHECK(marked == inner);
      // Layer 1's experts and the attention weights are not copied: not dropped.
      CHECK_FALSE(src->dropped(bind.mat("model.layers.1.mlp.experts.0.gate_proj.weight", I, H).data));
      CHECK_FALSE(src->dropped(bind.mat("model.layers.0.self_attn.q_proj.weight", c.num_attention_heads * c.head_dim, H).data));
      src->touch("touch", "none");
      // The pieces: E experts x nodes, in node memory (not the file map), the file's rows byte for byte.
      REQUIRE(copied.host_pieces() != nullptr);
      const auto& pieces = *copied.host_pieces();
      REQUIRE(static_cast<int64_t>(pieces.size()) == E);
      for (int64_t e = 0; e < E; ++e) {
        REQUIRE(static_cast<int>(pieces[static_cast<size_t>(e)].size()) == nodes);
        const numa::ExpertWeights& whole = copied.host_weights()[static_cast<size_t>(e)];
        int64_t gr = 0, dr = 0;
        for (const numa::ExpertWeights& p : pieces[static_cast<size_t>(e)]) {
          CHECK_FALSE(src->file_backed(p.gate.data, p.gate.bytes()));
          CHECK(std::memcmp(p.gate.data, whole.gate.row(gr), static_cast<size_t>(p.gate.rows) * p.gate.row_bytes()) == 0);
          CHECK(std::memcmp(p.up.data, whole.up.row(gr), static_cast<size_t>(p.up.rows) * p.up.row_bytes()) == 0);
          CHECK(std::memcmp(p.down.data, whole.down.row(dr), static_cast<size_t>(p.down.rows) * p.down.row_bytes()) == 0);
          gr += p.gate.rows;
          dr += p.down.rows;
        }
        CHECK(gr == I);
        CHECK(dr == H);
      }
      const std::vector<float> a = run(copied, 5, H);
      // The views of the same file map, read again after the drop: the same outputs bit for bit.
      ExpertHomeOptions view_opt;
      view_opt.engine.print_memory = false;
      view_opt.engine.copy_to_nodes = 0;
      RoutedExperts viewed(bind, c, 0, prefix, RoutedExperts::Home::host, pools, view_opt);
      CHECK(viewed.host_pieces() == nullptr);
      const std::vector<float> b = run(viewed, 5, H);
      REQUIRE(a.size() == b.size());
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      float mx = 0;
      for (float v : a) mx = std::max(mx, std::abs(v));
      CHECK(mx > 0);  // the experts really ran
    }
}

TEST_CASE("copy residence: the stream layout over node pieces copies each expert's rows from its pieces, nothing pinned, no image") {
  test::TempDir dir("host-residence-layout");
  const std::string path = write_model(dir, "q4k.gguf", 12);
  for (int nodes : {1, 2}) {
    CAPTURE(nodes);
    ModelConfig c;
    std::unique_ptr<WeightSource> src = open_gguf_source(path, c);
    WeightBinder bind(nullptr, src.get());
    numa::NodePools pools(pool_options(nodes));
    const int64_t E = c.num_experts;
    ExpertHomeOptions opt;
    opt.engine.print_memory = false;
    opt.residence = HostResidence::copy;
    RoutedExperts l0(bind, c, 0, "model.layers.0.mlp.", RoutedExperts::Home::host, pools, opt);
    RoutedExperts l1(bind, c, 1, "model.layers.1.mlp.", RoutedExperts::Home::host, pools, opt);
    // Registered by their owner (pretended here: no GPU): the layout must neither pin nor image them.
    StreamLayoutOptions lo;
    lo.pin_in_place = true;
    const StreamLayout lay = build_stream_layout(c, {{1, &l1.host_weights(), l1.host_pieces(), true}, {0, &l0.host_weights(), l0.host_pieces(), true}}, lo);
    CHECK(lay.quantized);
    CHECK(lay.in_place);
    CHECK(lay.registered);
    CHECK_FALSE(lay.pageable);
    CHECK(lay.image_bytes == 0);
    CHECK(lay.pins.empty());
    REQUIRE(lay.layers.size() == 2);
    for (size_t j = 0; j < 2; ++j) {
      const StreamLayerLayout& L = lay.layers[j];
      const RoutedExperts& r = j == 0 ? l0 : l1;
      CHECK(L.layer == static_cast<int64_t>(j));
      CHECK(L.native);
      CHECK(L.image.bytes() == 0);
      // The slot as the copies fill it, against the whole matrices' stored bytes.
      std::vector<char> slot(L.bytes, 0), all(L.bytes, 0);
      for (int64_t e = 0; e < E; ++e) {
        const auto& ops = L.by_expert[static_cast<size_t>(e)];
        CHECK(static_cast<int>(ops.size()) <= 3 * nodes);  // a copy per piece at most (neighbouring pieces may merge)
        for (const StreamCopy& op : ops) {
          bool in_node_memory = false;
          for (const auto& p : (*r.host_pieces())[static_cast<size_t>(e)])
            for (const cpu::Mat* m : {&p.gate, &p.up, &p.down}) {
              const char* d = static_cast<const char*>(m->data);
              in_node_memory = in_node_memory || (static_cast<const char*>(op.src) >= d && static_cast<const char*>(op.src) < d + m->bytes());
            }
          CHECK(in_node_memory);
          REQUIRE(op.dst + op.bytes <= slot.size());
          std::memcpy(slot.data() + op.dst, op.src, op.bytes);
        }
      }
      for (const StreamCopy& op : L.all) std::memcpy(all.data() + op.dst, op.src, op.bytes);
      CHECK(slot == all);  // the coalesced list copies the same bytes
      const size_t gu = reinterpret_cast<uintptr_t>(L.ngu.data), dn = reinterpret_cast<uintptr_t>(L.ndn.data);
      for (int64_t e = 0; e < E; ++e) {
        const numa::ExpertWeights& w = r.host_weights()[static_cast<size_t>(e)];
        const size_t g = w.gate.bytes(), u = w.up.bytes(), d = w.down.bytes();
        CHECK(std::memcmp(slot.data() + gu + static_cast<size_t>(e) * (g + u), w.gate.data, g) == 0);
        CHECK(std::memcmp(slot.data() + gu + static_cast<size_t>(e) * (g + u) + g, w.up.data, u) == 0);
        CHECK(std::memcmp(slot.data() + dn + static_cast<size_t>(e) * d, w.down.data, d) == 0);
      }
    }
  }
}

TEST_CASE("gpu_pin_host_experts: copy, map, off, the aliases 1 and 0, and bad values named") {
  CHECK(parse_host_residence("x", "copy") == HostResidence::copy);
  CHECK(parse_host_residence("x", "MAP") == HostResidence::map);
  CHECK(parse_host_residence("x", "1") == HostResidence::map);
  CHECK(parse_host_residence("x", "off") == HostResidence::off);
  CHECK(parse_host_residence("x", "0") == HostResidence::off);
  CHECK_THROWS_WITH_AS(parse_host_residence("--gpu-pin-host-experts", "yes"), doctest::Contains("--gpu-pin-host-experts=yes"), Error);
  std::vector<std::string> none;
  Settings s = Settings::load(none);
  CHECK(s.gpu_pin_host_experts == "copy");  // the default since it ran on an H100 (bench/README.md)
  CHECK(host_residence_of(s) == HostResidence::copy);
  for (const char* v : {"copy", "map", "off", "1", "0", "Copy"}) {
    std::vector<std::string> a = {"--gpu-pin-host-experts", v};
    CHECK_NOTHROW(Settings::load(a));
  }
  for (const char* v : {"2", "pinned", "true", ""}) {
    CAPTURE(v);
    std::vector<std::string> a = {"--gpu-pin-host-experts", v};
    CHECK_THROWS_WITH_AS(Settings::load(a), doctest::Contains("--gpu-pin-host-experts"), Error);
  }
  std::vector<std::string> a = {"--gpu-pin-host-experts", "bogus"};
  CHECK_THROWS_WITH_AS(Settings::load(a), doctest::Contains("copy, map, off, 1 or 0"), Error);
  std::vector<std::string> b = {"--gpu-pin-host-experts", "1"};
  CHECK(host_residence_of(Settings::load(b)) == HostResidence::map);
}

TEST_CASE("host residence choice: copy when the GPU reads host experts and MemAvailable holds them, else off with the shortfall named") {
  const uint64_t G = uint64_t{1} << 30;
  HostResidenceChoice c = choose_host_residence(HostResidence::copy, true, 10 * G, 0, static_cast<int64_t>(20 * G));
  CHECK(c.chosen == HostResidence::copy);
  c = choose_host_residence(HostResidence::copy, true, 10 * G, 2 * G, static_cast<int64_t>(12 * G));
  CHECK(c.chosen == HostResidence::off);
  CHECK(c.why.find("short by 1.00 GiB") != std::string::npos);
  CHECK(c.describe().find("asked copy") != std::string::npos);
  c = choose_host_residence(HostResidence::copy, false, 10 * G, 0, static_cast<int64_t>(20 * G));
  CHECK(c.chosen == HostResidence::off);
  CHECK(c.why.find("nothing copied") != std::string::npos);
  c = choose_host_residence(HostResidence::copy, true, 10 * G, 0, -1);
  CHECK(c.chosen == HostResidence::copy);  // MemAvailable unknown: go ahead
  CHECK(choose_host_residence(HostResidence::map, true, 10 * G, 0, 0).chosen == HostResidence::map);
  CHECK(choose_host_residence(HostResidence::off, true, 10 * G, 0, static_cast<int64_t>(20 * G)).chosen == HostResidence::off);
}

TEST_CASE("copy residence: experts in the loader's own buffers (no file map) are registered where they are, not copied") {
  // A synthetic layer handed out by a lookup (as bench/ models and --dtype conversions are: heap memory).
  const int64_t H = 64, I = 32, E = 3;
  std::map<std::string, std::vector<uint16_t>> store;
  WeightLookup lookup = [&](const std::string& name, const std::vector<int64_t>& shape) {
    if (shape.size() != 2) fail(ErrorKind::bad_model, "no tensor " + name);
    auto& v = store[name];
    if (v.empty()) {
      const auto f = test::random_floats(static_cast<size_t>(shape[0] * shape[1]), std::hash<std::string>{}(name), 0.1f);
      for (float x : f) v.push_back(f32_to_bf16(x));
    }
    return cpu::Mat{DType::bf16, v.data(), shape[0], shape[1]};
  };
  WeightBinder bind(lookup);
  ModelConfig c;
  c.hidden_size = H;
  c.moe_intermediate_size = I;
  c.num_experts = E;
  c.num_experts_per_tok = 2;
  numa::NodePools pools(pool_options(2));
  ExpertHomeOptions opt;
  opt.engine.print_memory = false;
  opt.residence = HostResidence::copy;
  HostResidenceStats st;
  opt.residence_stats = &st;
  RoutedExperts r(bind, c, 0, "model.layers.0.mlp.", RoutedExperts::Home::host, pools, opt);
  CHECK(r.host_pieces() == nullptr);  // the bytes stay the loader's: no second copy
  CHECK(st.layers == 1);
  CHECK(st.in_place_layers == 1);
  CHECK(st.in_place_bytes == static_cast<uint64_t>(3 * E * H * I * 2));
  CHECK(st.copied_bytes == 0);
  CHECK(st.dropped_bytes == 0);
  CHECK_FALSE(st.refused.empty());  // no CUDA here: nothing registered
  CHECK(st.describe().find("registered where they are") != std::string::npos);
  // The ranges registering them in place would cover: page-rounded, merged, every byte of every matrix inside.
  std::vector<cpu::Mat> mats;
  for (const auto& w : r.host_weights()) mats.insert(mats.end(), {w.gate, w.up, w.down});
  const auto ranges = host_ranges(mats);
  REQUIRE_FALSE(ranges.empty());
  for (size_t i = 0; i < ranges.size(); ++i) {
    CHECK(reinterpret_cast<uintptr_t>(ranges[i].data) % 4096 == 0);
    CHECK(ranges[i].bytes % 4096 == 0);
    if (i) CHECK(ranges[i - 1].data + ranges[i - 1].bytes < ranges[i].data);  // merged where they touch
  }
  for (const cpu::Mat& m : mats) {
    const auto* p = static_cast<const uint8_t*>(m.data);
    bool inside = false;
    for (const auto& g : ranges) inside = inside || (p >= g.data && p + m.bytes() <= g.data + g.bytes);
    CHECK(inside);
  }
}
