// hmoe generate: greedy continuation of a list of token ids, optionally with
// the top logits of every prompt position and every step as JSON (the format
// the reference fixtures are compared in).
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/loading/demo_model.h"
#include "engine/loading/model.h"
#include "engine/serving/logits.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {
namespace {

nlohmann::json top_json(const float* row, int64_t vocab, int64_t k, bool with_lse) {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  top_k(row, vocab, k, ids, vals);
  nlohmann::json j = {{"top_ids", ids}, {"top_logits", vals}};
  if (with_lse) j["logsumexp"] = logsumexp(row, vocab);
  return j;
}

int run_generate(const Settings& s, std::vector<std::string>& args) {
  std::string ids_s, max_s = "16", topk_s = "0";
  bool have_ids = take_option(args, "--ids", ids_s);
  take_option(args, "--max-tokens", max_s);
  take_option(args, "--top-logits", topk_s);
  bool json = take_flag(args, "--json");
  reject_unknown_flags(args, "generate");
  if (args.size() > 1) fail(ErrorKind::invalid_argument, "generate takes one MODEL, got " + std::to_string(args.size()) + " positional arguments");
  std::string model_dir = args.empty() ? ensure_demo_model(s) : args[0];
  if (!have_ids) fail(ErrorKind::invalid_argument, "--ids is required (comma-separated token ids)");
  std::vector<int64_t> ids = parse_id_list("--ids", ids_s);
  const int64_t max_tokens = parse_int("--max-tokens", max_s), top = parse_int("--top-logits", topk_s);
  if (max_tokens < 0) fail(ErrorKind::invalid_argument, "--max-tokens must be >= 0");
  if (top < 0) fail(ErrorKind::invalid_argument, "--top-logits must be >= 0");

  auto model = Model::load(model_dir, s);
  const ModelConfig& c = model->config();
  for (auto id : ids)
    if (id < 0 || id >= c.vocab_size)
      fail(ErrorKind::invalid_argument, "--ids: token id " + std::to_string(id) + " is outside the vocabulary (0.." + std::to_string(c.vocab_size - 1) + ")");
  const int64_t total = static_cast<int64_t>(ids.size()) + max_tokens;
  const int64_t ctx = s.max_model_len > 0 ? s.max_model_len : c.max_position_embeddings;
  if (total > ctx)
    fail(ErrorKind::invalid_argument, "prompt (" + std::to_string(ids.size()) + ") + --max-tokens (" + std::to_string(max_tokens) +
                                          ") exceeds the context length " + std::to_string(ctx));
  const int64_t block = 16;
  KvCache kv(model->kv_layout(), (total + block - 1) / block + 1, block);
  int seq = kv.add_sequence();
  kv.reserve(seq, total);

  Batch b;
  for (size_t i = 0; i < ids.size(); ++i) b.add(static_cast<int32_t>(ids[i]), seq, static_cast<int64_t>(i), top > 0 || i + 1 == ids.size());
  std::vector<float> logits;
  auto t0 = std::chrono::steady_clock::now();
  model->forward(b, kv, logits);
  auto t1 = std::chrono::steady_clock::now();
  nlohmann::json out;
  out["prompt"] = nlohmann::json::array();
  const int64_t V = c.vocab_size;
  if (top > 0)
    for (size_t r = 0; r < ids.size(); ++r) out["prompt"].push_back(top_json(logits.data() + r * V, V, top, true));
  std::vector<float> last(logits.end() - V, logits.end());
  std::vector<int32_t> gen;
  out["steps"] = nlohmann::json::array();
  int64_t pos = static_cast<int64_t>(ids.size());
  for (int64_t i = 0; i < max_tokens; ++i) {
    int32_t next = argmax(last.data(), V);
    gen.push_back(next);
    if (top > 0) out["steps"].push_back(top_json(last.data(), V, top, false));
    if (i + 1 == max_tokens) break;
    b.clear();
    b.add(next, seq, pos++, true);
    model->forward(b, kv, last);
  }
  auto t2 = std::chrono::steady_clock::now();
  out["ids"] = gen;
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count(), decode_s = std::chrono::duration<double>(t2 - t1).count();
  if (json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    for (size_t i = 0; i < gen.size(); ++i) std::printf("%s%d", i ? "," : "", gen[i]);
    std::printf("\n");
  }
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tok/s); decode: %lld tokens in %.3f s (%.1f tok/s)\n", ids.size(), prefill_s,
               static_cast<double>(ids.size()) / std::max(prefill_s, 1e-9), static_cast<long long>(max_tokens), decode_s,
               static_cast<double>(max_tokens > 1 ? max_tokens - 1 : 0) / std::max(decode_s, 1e-9));
  return 0;
}

}  // namespace
HMOE_COMMAND(generate_cmd, "generate", "generate [MODEL] --ids 1,2,3 [--max-tokens N] [--top-logits K] [--json]",
             "greedy continuation of token ids (MODEL defaults to the built-in random demo model)", run_generate);
}  // namespace hmoe::cli
