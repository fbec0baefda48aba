// The GPU memory cap (setting gpu_memory, gpu/memory_cap.h) and the
// automatic fit (engine/placement/auto_fit.h), CPU side: the budget and its
// errors, the ledger every device allocation passes through, and the fit's
// options for a Qwen3-30B-A3B-shaped model on a 24 GiB card (every option
// within the budget, the best chosen, a skewed routing trace moving bytes
// from resident layers to the cache).
#include <doctest/doctest.h>

#include <functional>

#include "configs/error.h"
#include "engine/layers/expert_stream.h"
#include "engine/layers/expert_stream_chunks.h"
#include "engine/layers/routing_trace.h"
#include "engine/placement/auto_fit.h"
#include "engine/placement/placement.h"
#include "gpu/memory_cap.h"

using namespace hmoe;

namespace {

ModelConfig qwen3_30b_shape(int64_t layers = 48) {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.moe_intermediate_size = 768;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.num_experts = 128;
  c.num_experts_per_tok = 8;
  c.max_position_embeddings = 40960;
  return c;
}

Settings quiet_settings(std::vector<std::string> args = {}) {
  Settings s = Settings::load(args);
  s.progress = "none";
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("--gpu-memory: the budget, its origin, bad values") {
  Settings s = quiet_settings({"--gpu-memory", "24GiB"});
  CHECK(s.gpu_memory == (24ull << 30));
  CHECK(gpu_memory_capped(s));
  const GpuTarget h100{"H100", 80ull << 30, 3.3e12, false};
  CHECK(gpu_memory_budget(s, h100) == static_cast<uint64_t>((24ull << 30) * 0.9));
  CHECK(gpu_memory_budget_origin(s, h100).find("--gpu-memory 24.00 GiB") != std::string::npos);
  s.gpu_memory = 100ull << 30;  // more than the card
  const std::string e = error_of([&] { gpu_memory_budget(s, h100); });
  CHECK(e.find("more than H100 has") != std::string::npos);
  CHECK(gpu_memory_budget(s, GpuTarget{"assumed", 24ull << 30, 1e12, true}) == static_cast<uint64_t>((100ull << 30) * 0.9));
  Settings d = quiet_settings();
  CHECK(!gpu_memory_capped(d));  // neither flag: only the plan uses the budget
  CHECK(gpu_memory_budget(d, h100) == static_cast<uint64_t>((80ull << 30) * 0.9));
  CHECK(gpu_memory_capped(quiet_settings({"--gpu-memory-utilization", "0.5"})));
  for (const char* bad : {"-1", "24XB", "lots", "2TiB"}) {
    const std::string m = error_of([&] { quiet_settings({"--gpu-memory", bad}); });
    CHECK_MESSAGE(m.find("--gpu-memory") != std::string::npos, bad << ": " << m);
  }
  CHECK(error_of([] { quiet_settings({"--gpu-memory-utilization", "1.5"}); }).find("--gpu-memory-utilization") != std::string::npos);
  CHECK(error_of([] { quiet_settings({"--gpu-memory-utilization", "0"}); }).find("--gpu-memory-utilization") != std::string::npos);
}

TEST_CASE("GPU memory ledger: the cap names what did not fit") {
  gpu::MemoryLedger l;
  l.acquire(10ull << 30, "anything");  // no cap: counted only
  CHECK(l.held() == (10ull << 30));
  CHECK(l.room() == UINT64_MAX);
  l.release(10ull << 30);
  l.set_cap(1ull << 30, "--gpu-memory 1 GiB");
  {
    gpu::MemoryUse use("the KV cache (64 blocks)");
    l.acquire(600ull << 20, gpu::MemoryUse::current());
    CHECK(l.room() == (424ull << 20));
    try {
      l.acquire(600ull << 20, gpu::MemoryUse::current());
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::out_of_memory);
      const std::string m = e.what();
      CHECK(m.find("the KV cache (64 blocks) needs 600 MiB") != std::string::npos);
      CHECK(m.find("--gpu-memory 1 GiB") != std::string::npos);
      CHECK(m.find("176 MiB missing") != std::string::npos);
    }
    CHECK(l.held() == (600ull << 20));  // the refused allocation is not counted
  }
  CHECK(gpu::MemoryUse::current() == "GPU buffer");
  l.release(600ull << 20);
  l.acquire(1ull << 30, "x");  // exactly the cap fits
  CHECK(l.room() == 0);
  CHECK(l.peak() == (10ull << 30));  // the uncapped 10 GiB at the start
}

TEST_CASE("automatic fit: Qwen3-30B-A3B shape on a 24 GiB card") {
  const ModelConfig c = qwen3_30b_shape();
  Settings s = quiet_settings({"--gpu-memory", "24GiB", "--gpu-expert-cache", "auto"});  // the cache is off by default (settings.inc)
  const GpuTarget gpu{"a 24 GiB card", 24ull << 30, 1e12, true};
  FitInputs in;
  in.gpu_bandwidth = 1e12;
  in.cpu_bandwidth = 60e9;
  in.context = 8192;
  const FitChoice f = auto_fit(c, s, gpu, in);
  REQUIRE(f.options.size() == 49);
  const FitOption& best = f.chosen();
  CHECK(best.fits);
  int64_t fitting = 0;
  for (const FitOption& o : f.options) {
    if (!o.fits) {
      CHECK(!o.why.empty());
      continue;
    }
    ++fitting;
    CHECK(f.fixed_bytes + f.workspace_bytes + o.expert_bytes + o.kv_bytes + o.slot_bytes + o.cache_bytes <= f.budget);
    // The chosen option keeps streamed prefill (slots, or every layer resident) and is the fastest that does;
    // options without the slots may decode faster (their bytes hold more experts).
    if (o.stream_slots > 0 || o.resident == 48) CHECK(o.tok_s <= best.tok_s * 1.005);
    CHECK(o.kv_blocks == kv_blocks_for(1, 8192, 16));  // one context and a block of headroom
  }
  CHECK(fitting > 1);
  CHECK(fitting < 49);  // 48 bf16 layers (57 GiB of experts) do not fit 24 GiB
  CHECK(best.resident > 0);
  CHECK(best.stream_slots == 2);  // window 1: two whole-layer slots
  const std::string table = fit_table(f);
  CHECK(table.find("**chosen**") != std::string::npos);
  CHECK(table.find("uniform routing") != std::string::npos);
  MESSAGE(table);
  // Without streamed prefill the slots' bytes go to resident layers or the cache.
  Settings s0 = s;
  s0.gpu_prefill_min_batch_size = "0";
  FitInputs in0 = in;
  in0.stream_slots = false;
  const FitChoice f0 = auto_fit(c, s0, gpu, in0);
  CHECK(f0.chosen().stream_slots == 0);
  CHECK(f0.chosen().tok_s >= best.tok_s);
  CHECK(f0.chosen().resident > best.resident);
  // A skewed trace: the cache hits far more than its share, which no resident layer can.
  const RoutingTrace z = zipf_routing_trace(1.2, 128, 8, 48, 300, 1, 9);
  FitInputs iz = in;
  iz.trace = &z;
  const FitChoice fz = auto_fit(c, s, gpu, iz);
  const FitOption& bz = fz.chosen();
  MESSAGE(fit_table(fz));
  CHECK(bz.hit_rate > static_cast<double>(bz.cache_experts) / (static_cast<double>(48 - bz.resident) * 128) + 0.1);
  CHECK(bz.tok_s > best.tok_s);
  // A trace of another model is refused.
  const RoutingTrace other = zipf_routing_trace(1.0, 64, 8, 48, 10);
  iz.trace = &other;
  CHECK(error_of([&] { auto_fit(c, s, gpu, iz); }).find("64 experts per layer") != std::string::npos);
  // Nothing fits: the shortfall, as make_plan says it.
  Settings small = s;
  small.gpu_memory = 1ull << 30;
  const std::string e = error_of([&] { auto_fit(c, small, GpuTarget{"tiny", 1ull << 30, 1e12, true}, in); });
  CHECK(e.find("does not fit") != std::string::npos);
}

TEST_CASE("automatic fit: streamed prefill costs no resident layer here (Q8_0 experts, 24 GiB, the step's room sized on its tokens)") {
  // The 48-layer Q8_0-expert model of bench/jobs/k27b.sh: on the H100 the best static placement (28 resident) decoded
  // 67.6 tok/s, `auto` 60.3 (24 resident: the step's room was 1 GiB + 5% of the card whatever the step's size, and
  // the stream kept its own copy of the buffers the resident layers' big passes already have).
  ModelConfig c = qwen3_30b_shape();
  c.expert_bytes_per_weight = 1.0625;
  c.gpu_expert_bytes_per_weight = 1.0625;
  const Settings s = quiet_settings({"--gpu-memory", "24GiB", "--gpu-expert-cache", "0", "--max-model-len", "8192"});
  const GpuTarget gpu{"a 24 GiB card", 24ull << 30, 1e12, true};
  ExpertStreamOptions so;
  so.max_tokens = s.max_num_batched_tokens;
  const uint64_t own = expert_stream_step_room(c, so, 24ull << 30);
  so.shared_scratch = true;
  const uint64_t shared = expert_stream_step_room(c, so, 24ull << 30);
  MESSAGE("step room for " << so.max_tokens << " tokens: " << format_bytes(own) << " with its own buffers, " << format_bytes(shared) << " shared");
  // 128 MiB + 0.5% of the card + lists; its own buffers add 2048 x 8 pairs x ~15.5 KiB.
  CHECK(shared > (250ull << 20));
  CHECK(shared < (300ull << 20));
  CHECK(own > shared + (240ull << 20));
  so.shared_scratch = false;
  so.max_tokens = 8192;
  CHECK(expert_stream_step_room(c, so, 24ull << 30) > own + (700ull << 20));  // four times the pairs
  so.max_tokens = 0;
  CHECK(expert_stream_step_room(c, so, 24ull << 30) > (1ull << 30));  // unknown: a whole GiB
  so.dequant_chunks = true;
  CHECK(expert_stream_step_room(c, so, 24ull << 30) > (1536ull << 20));  // and the bf16 chunks
  so.shared_scratch = true;
  CHECK(expert_stream_step_room(c, so, 24ull << 30) > shared + (500ull << 20));  // the chunks stay: no workspace counts them
  FitInputs in;
  in.gpu_bandwidth = 3e12;
  in.cpu_bandwidth = 95e9;
  in.server_kv = true;
  const FitChoice f = auto_fit(c, s, gpu, in);
  int64_t most = 0;
  for (const FitOption& o : f.options) {
    if (!o.fits) continue;
    most = std::max(most, o.resident);
    CHECK(f.fixed_bytes + f.workspace_bytes + o.expert_bytes + o.kv_bytes + o.slot_bytes + o.cache_bytes <= f.budget);
  }
  const FitOption& best = f.chosen();
  MESSAGE(fit_table(f));
  CHECK(best.stream_slots >= 2);
  CHECK(best.stream_chunk >= kMinChunkExperts);
  CHECK(best.resident == most);
}

TEST_CASE("KV budget: the fit reserves the blocks the server allocates (one rule, default_kv_blocks), explicit bytes win") {
  const ModelConfig c = qwen3_30b_shape();
  const GpuTarget gpu{"a 24 GiB card", 24ull << 30, 1e12, true};
  FitInputs in;
  in.context = 8192;
  in.server_kv = true;
  for (const char* seqs : {"1", "4", "64"}) {
    Settings s = quiet_settings({"--gpu-memory", "24GiB", "--max-num-seqs", seqs});
    const FitChoice f = auto_fit(c, s, gpu, in);
    const FitOption& o = f.chosen();
    const Plan p = make_plan(c, [&] {
      Settings t = s;
      t.gpu_resident_moe_layers = "none";
      t.max_model_len = 8192;
      return t;
    }(), gpu);
    const int64_t block_bytes = static_cast<int64_t>(16 * p.kv_bytes_per_token);
    const int64_t want = default_kv_blocks(s, 8192, block_bytes);
    MESSAGE("--max-num-seqs " << std::string(seqs) << ": the fit reserves " << o.kv_blocks << " KV blocks (" << format_bytes(o.kv_bytes) << ")");
    CHECK(o.kv_blocks == want);
    CHECK(o.kv_bytes == static_cast<uint64_t>(want) * static_cast<uint64_t>(block_bytes));
    // The server allocates exactly what the fit reserved (Model::fit_kv_blocks -> server_kv_blocks).
    CHECK(server_kv_blocks(s, 8192, block_bytes, o.kv_blocks) == o.kv_blocks);
    // max_num_seqs full contexts up to 512 MiB, at least one context.
    CHECK(want == std::max(std::min<int64_t>(std::stoll(seqs) * kv_blocks_for(1, 8192, 16), (int64_t{512} << 20) / block_bytes), kv_blocks_for(1, 8192, 16)));
  }
  // --kv-cache-memory-bytes: the fit reserves that and the server takes it, whatever was reserved.
  Settings s = quiet_settings({"--gpu-memory", "24GiB", "--kv-cache-memory-bytes", "2GiB"});
  const FitChoice f = auto_fit(c, s, gpu, in);
  CHECK(f.chosen().kv_bytes <= (2ull << 30));
  CHECK(f.chosen().kv_bytes > (2ull << 30) - 16 * 200000);
  CHECK(server_kv_blocks(s, 8192, 1 << 20, 7) == 2048);
  // Nothing reserved: the default rule; a reservation below one context is raised to one context.
  Settings d = quiet_settings();
  CHECK(server_kv_blocks(d, 8192, 1 << 20, 0) == default_kv_blocks(d, 8192, 1 << 20));
  CHECK(server_kv_blocks(d, 8192, 1 << 20, 3) == kv_blocks_for(1, 8192, 16));
  CHECK(kv_blocks_for(2, 17, 16) == 2 * 3);
  Settings tiny = quiet_settings({"--kv-cache-memory-bytes", "100"});
  CHECK(error_of([&] { default_kv_blocks(tiny, 8192, 1 << 20); }).find("--kv-cache-memory-bytes") != std::string::npos);
}

TEST_CASE("first_moe_layers: lists for gpu_resident_moe_layers") {
  ModelConfig c = qwen3_30b_shape(8);
  CHECK(first_moe_layers(c, 0) == "none");
  CHECK(first_moe_layers(c, 3) == "0-2");
  CHECK(first_moe_layers(c, 8) == "all");
  const LayerSpec spec = parse_layer_spec("x", first_moe_layers(c, 5), 8);
  CHECK(spec.layers == std::vector<int64_t>{0, 1, 2, 3, 4});
}
