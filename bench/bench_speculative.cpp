// Speculative decoding with the model's MTP head (--speculative-tokens N,
// issue 25) through the scheduler, batch 1, greedy: per N = 0..3 the decode
// speed (tokens after the first / time after the first), steps per token,
// the acceptance rate of the drafts, and the speed-up over N = 0. Then the
// verify path alone: drafts forced right (the N = 0 run's own continuation,
// no head), every draft accepted, N = 1..3; and forced wrong (every draft
// rejected: the cost of verifying and rolling back for nothing). Each row
// also prints the weight bytes a step reads over the step time (GB/s), the
// roofline a batch-1 decode is bound by. On the tiny fixture the head is
// random (acceptance near 0), so the forced rows show what the verify path
// buys. Never passes or fails on time.
// Usage: bench_speculative MODEL [--tokens 48] [--prompts 3] [--threads 0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "configs/error.h"
#include "engine/loading/model.h"
#include "engine/serving/scheduler.h"

using namespace hmoe;

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::vector<std::vector<int32_t>> out;
  double decode_s = 0;
  int64_t decode_tokens = 0, steps = 0, drafted = 0, accepted = 0;
};

// Prompts one after another (batch 1); decode time = from each first token to the end.
Result run(Model& m, const std::vector<std::vector<int32_t>>& prompts, int64_t tokens, const SchedulerConfig& c) {
  Scheduler sched(m, c);
  Result r;
  for (const auto& p : prompts) {
    Clock::time_point first{};
    bool seen = false;
    auto req = std::make_unique<SeqRequest>();
    req->prompt = p;
    req->max_tokens = tokens;
    req->sampling.temperature = 0;
    req->channel = std::make_shared<SeqChannel>([&] {
      if (!seen) first = Clock::now(), seen = true;
    });
    auto ch = req->channel;
    const int64_t steps0 = sched.stats().steps;
    if (sched.submit(std::move(req)) != Scheduler::Submit::ok) fail(ErrorKind::internal, "submit refused");
    auto d = ch->wait_all();
    const auto end = Clock::now();
    if (!d.error.empty()) fail(ErrorKind::internal, d.error);
    std::vector<int32_t> out;
    for (const auto& e : d.tokens) out.push_back(e.token);
    r.out.push_back(out);
    r.decode_s += std::chrono::duration<double>(end - first).count();
    r.decode_tokens += static_cast<int64_t>(out.size()) - 1;
    r.steps += sched.stats().steps - steps0 - 1;  // the prefill step produced the first token
  }
  const SchedulerStats st = sched.stats();
  r.drafted = st.spec_drafted;
  r.accepted = st.spec_accepted;
  return r;
}

std::unique_ptr<Model> load(const std::string& dir, int64_t threads, int64_t spec) {
  Settings s = Settings::defaults();
  s.progress = "none";
  s.device = "cpu";
  s.threads = threads;
  s.speculative_tokens = spec;
  return Model::load(dir, s);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) {
      std::fprintf(stderr, "usage: bench_speculative MODEL [--tokens 48] [--prompts 3] [--threads 0]\n");
      return 2;
    }
    const std::string dir = argv[1];
    int64_t tokens = 48, nprompts = 3, threads = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
      const std::string a = argv[i];
      const int64_t v = std::atoll(argv[i + 1]);
      if (a == "--tokens") tokens = v;
      else if (a == "--prompts") nprompts = v;
      else if (a == "--threads") threads = v;
      else fail(ErrorKind::invalid_argument, "bench_speculative: unknown option " + a);
    }
    std::mt19937_64 rng(5);
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < nprompts; ++i) {
      std::vector<int32_t> p(20 + rng() % 40);
      for (auto& t : p) t = static_cast<int32_t>(rng() % 150000);
      prompts.push_back(p);
    }
    SchedulerConfig c;
    c.kv_blocks = 4 * (tokens + 64) / 16 + 16;
    c.prefix_caching = false;

    auto base_model = load(dir, threads, 0);
    const double wbytes = static_cast<double>(base_model->weight_bytes());
    std::printf("bench_speculative: %s, %lld prompts x %lld tokens, batch 1, greedy; weights %.1f MB (read once per step at batch 1)\n",
                dir.c_str(), static_cast<long long>(nprompts), static_cast<long long>(tokens), wbytes / 1e6);
    std::printf("%-28s %10s %9s %10s %10s %9s %9s\n", "case", "tok/s", "ms/step", "tok/step", "accepted", "speed-up", "GB/s");
    auto row = [&](const char* name, const Result& r, double base_tps) {
      const double tps = static_cast<double>(r.decode_tokens) / r.decode_s;
      const double ms = r.decode_s / static_cast<double>(r.steps) * 1e3;
      char acc[32] = "-";
      if (r.drafted > 0) std::snprintf(acc, sizeof acc, "%.1f%%", 100.0 * static_cast<double>(r.accepted) / static_cast<double>(r.drafted));
      std::printf("%-28s %10.1f %9.2f %10.2f %10s %8.2fx %9.2f\n", name, tps, ms, static_cast<double>(r.decode_tokens) / static_cast<double>(r.steps), acc,
                  base_tps > 0 ? tps / base_tps : 1.0, wbytes / (ms * 1e-3) / 1e9);
      return tps;
    };
    run(*base_model, prompts, tokens, c);  // warm-up (page faults, thread start)
    const Result base = run(*base_model, prompts, tokens, c);
    const double base_tps = row("N=0 (plain decode)", base, 0);
    base_model.reset();

    auto oracle = [&](std::span<const int32_t> t, int64_t n) {
      std::vector<int32_t> d;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const auto& p = prompts[i];
        const auto& o = base.out[i];
        if (t.size() < p.size() || !std::equal(p.begin(), p.end(), t.begin())) continue;
        for (size_t k = t.size() - p.size(); k < o.size() && static_cast<int64_t>(d.size()) < n; ++k) d.push_back(o[k]);
        break;
      }
      return d;
    };
    for (int64_t n = 1; n <= 3; ++n) {
      auto m = load(dir, threads, n);
      run(*m, prompts, tokens, c);
      const Result r = run(*m, prompts, tokens, c);
      const std::string name = "N=" + std::to_string(n) + " MTP head";
      row(name.c_str(), r, base_tps);
      if (r.out != base.out) std::printf("  OUTPUT DIFFERS from N=0\n");
      SchedulerConfig right = c;
      right.draft_override = oracle;
      const Result fr = run(*m, prompts, tokens, right);
      row(("N=" + std::to_string(n) + " forced right").c_str(), fr, base_tps);
      if (fr.out != base.out) std::printf("  OUTPUT DIFFERS from N=0\n");
      SchedulerConfig wrong = c;
      const int32_t never = static_cast<int32_t>(m->config().vocab_size - 1);
      wrong.draft_override = [never](std::span<const int32_t>, int64_t k) { return std::vector<int32_t>(static_cast<size_t>(k), never); };
      const Result fw = run(*m, prompts, tokens, wrong);
      row(("N=" + std::to_string(n) + " forced wrong").c_str(), fw, base_tps);
      if (fw.out != base.out) std::printf("  OUTPUT DIFFERS from N=0\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_speculative: %s\n", e.what());
    return 1;
  }
}
