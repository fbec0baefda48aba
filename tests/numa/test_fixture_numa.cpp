// The tiny Qwen3-MoE fixture through the NUMA expert engine on the machine's
// topology and on synthetic 2- and 4-node ones (slices copied per node), in
// spin and sleep modes: every prompt position's reference top-10 logits and
// log-sum-exp within 2e-3 of Hugging Face's fp32 run, and the greedy ids.
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/loading/model.h"
#include "engine/serving/logits.h"
#include "io/mmap_file.h"
#include "tests/test_util.h"

using namespace hmoe;

TEST_CASE("tiny-qwen3moe matches the fp32 reference on 1, 2 and 4 NUMA nodes") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(io::file_exists(dir + "/model-00001-of-00003.safetensors"), "fixture shards missing in " << dir);
  const auto ref = nlohmann::json::parse(test::read_file(test::fixture_ref("tiny-qwen3moe/hf_reference.json")));
  struct Case { const char* topology; bool power_saving; int threads; };
  for (Case tc : {Case{"", false, 0}, Case{"numa:2 core:1 pu:1", false, 2}, Case{"numa:4 core:1 pu:1", true, 4},
                  Case{"pack:2 numa:2 core:2 pu:1", false, 3}}) {
    Settings s = Settings::defaults();
    s.progress = "none";
    s.topology = tc.topology;
    s.power_saving = tc.power_saving;
    s.threads = tc.threads;
    auto model = Model::load(dir, s);
    const int64_t V = model->config().vocab_size;
    double max_diff = 0;
    for (size_t c = 0; c < ref["chats"].size(); ++c) {
      const auto& chat = ref["chats"][c];
      const auto ids = chat["ids"].get<std::vector<int32_t>>();
      const auto greedy = chat["greedy_ids"].get<std::vector<int32_t>>();
      const int64_t total = static_cast<int64_t>(ids.size() + greedy.size());
      KvCache kv(model->kv_layout(), total / 16 + 2, 16);
      const int seq = kv.add_sequence();
      kv.reserve(seq, total);
      Batch b;
      for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], seq, static_cast<int64_t>(i), true);
      std::vector<float> logits;
      model->forward(b, kv, logits);
      for (size_t p = 0; p < ids.size(); ++p) {
        const float* row = logits.data() + p * V;
        for (size_t r = 0; r < 10; ++r) {
          const double d = std::fabs(row[chat["top10_ids"][p][r].get<int32_t>()] - chat["top10_logits"][p][r].get<double>());
          max_diff = std::max(max_diff, d);
          REQUIRE_MESSAGE(d <= 2e-3, "topology '" << tc.topology << "' chat " << c << " position " << p << " rank " << r);
        }
        REQUIRE(std::fabs(logsumexp(row, V) - chat["logsumexp"][p].get<double>()) <= 2e-3);
      }
      std::vector<float> last(logits.end() - V, logits.end());
      int64_t pos = static_cast<int64_t>(ids.size());
      for (size_t step = 0; step < greedy.size(); ++step) {
        const int32_t next = argmax(last.data(), V);
        REQUIRE_MESSAGE(next == greedy[step], "topology '" << tc.topology << "' chat " << c << " greedy step " << step);
        b.clear();
        b.add(next, seq, pos++, true);
        model->forward(b, kv, last);
      }
    }
    MESSAGE("topology '" << std::string(tc.topology) << "': max |logit - HF| " << max_diff);
  }
}
