// The hmoe command line: settings from flags and environment, and bad
// arguments as clear errors with a non-zero exit code (the binary is run).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "configs/settings.h"
#include "tests/test_util.h"
#include "tests/tools/cli_run.h"

using namespace hmoe;

using test::contains;
using test::Run;
using test::run;
using test::run_cmd;
using test::run_env;

TEST_CASE("settings: defaults, environment, flags, and bad values") {
  std::vector<std::string> args = {"--port", "9001", "MODEL", "--threads=3", "--power-saving"};
  ::setenv("HMOE_MAX_NUM_SEQS", "12", 1);
  ::setenv("HMOE_PORT", "7000", 1);
  Settings s = Settings::load(args);
  CHECK(s.port == 9001);  // flag wins over environment
  CHECK(s.max_num_seqs == 12);
  CHECK(s.threads == 3);
  CHECK(s.power_saving);
  CHECK(args == std::vector<std::string>{"MODEL"});
  ::setenv("HMOE_MAX_NUM_SEQS", "twelve", 1);
  try {
    std::vector<std::string> none;
    Settings::load(none);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(contains(e.what(), "HMOE_MAX_NUM_SEQS"));
    CHECK(contains(e.what(), "twelve"));
  }
  ::unsetenv("HMOE_MAX_NUM_SEQS");
  ::unsetenv("HMOE_PORT");
  std::vector<std::string> bad = {"--max-body-bytes", "12XB"};
  CHECK_THROWS_AS(Settings::load(bad), Error);
  CHECK(parse_bytes("x", "2GiB") == 2ull << 30);
  CHECK(parse_bytes("x", "1.5k") == 1536);
  CHECK_THROWS_AS(parse_int("x", "12abc"), Error);
  CHECK_THROWS_AS(parse_int("x", "99999999999999999999999"), Error);
  CHECK_THROWS_AS(parse_float("x", "nan"), Error);
  CHECK_THROWS_AS(parse_bool("x", "maybe"), Error);
  // Every row has a flag and an HMOE_ variable.
  for (const auto& r : setting_table()) {
    CHECK(std::string(r.flag).rfind("--", 0) == 0);
    CHECK(std::string(r.env).rfind("HMOE_", 0) == 0);
  }
  CHECK(contains(settings_markdown(), "HMOE_THREADS"));
}

TEST_CASE("settings: every value is checked once against settings.inc's allowed values, naming origin, value and what is allowed") {
  auto error_of = [](std::vector<std::string> args) -> std::string {
    try {
      Settings::load(args);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_argument);
      return e.what();
    }
    return "";
  };
  CHECK(error_of({"--dtype", "int8"}) == "--dtype='int8': expected auto, bf16 or f32");
  CHECK(error_of({"--gpu-prefetch-window", "9"}) == "--gpu-prefetch-window=9: expected 1..8");
  CHECK(error_of({"--threads=5000"}) == "--threads=5000: expected 0..4096");
  CHECK(error_of({"--block-size", "24"}) == "--block-size=24: expected 1..65536; 0 or a power of two");
  CHECK(error_of({"--gpu-memory-utilization", "0"}) == "--gpu-memory-utilization=0: expected 0.01..1");
  CHECK(error_of({"--gpu-prefill-min-batch-size", "lots"}) == "--gpu-prefill-min-batch-size='lots': expected auto or a whole number >= 0");
  ::setenv("HMOE_PLE_BACKEND", "floppy", 1);
  CHECK(error_of({}) == "environment variable HMOE_PLE_BACKEND='floppy': expected io_uring, mmap, pread or ram");
  ::unsetenv("HMOE_PLE_BACKEND");
  // Choices are read in lower case; every check names a setting of the table (load() would throw otherwise).
  std::vector<std::string> args = {"--device", "CUDA", "--dtype", "BF16"};
  const Settings s = Settings::load(args);
  CHECK(s.device == "cuda");
  CHECK(s.weight_dtype == "bf16");
  CHECK(setting_allowed("threads") == "0..4096");
  CHECK(setting_allowed("api_key").empty());
  Settings code = Settings::defaults();
  code.validate();  // the defaults are valid
  code.http_worker_nice = 20;
  CHECK_THROWS_WITH_AS(code.validate(), "--http-worker-nice / HMOE_HTTP_WORKER_NICE=20: expected 0..19", Error);
}

TEST_CASE("hmoe --help lists the commands and settings") {
  Run r = run("--help");
  CHECK(r.code == 0);
  CHECK(contains(r.out, "generate"));
  CHECK(contains(r.out, "HMOE_THREADS"));
  CHECK(run("no-such-command").code != 0);
}

TEST_CASE("hmoe generate: bad arguments are errors naming the problem") {
  const std::string model = test::fixture_model("tiny-qwen3moe");
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"generate " + model + " --ids 1,x,3", "--ids"},
      {"generate " + model + " --ids 1,,3", "empty element"},
      {"generate " + model + " --ids 999999999 --progress none", "outside the vocabulary"},
      {"generate " + model + " --ids -5 --progress none", "outside the vocabulary"},
      {"generate " + model + " --ids 1 --max-tokens -2", "--max-tokens"},
      {"generate " + model + " --ids 1 --max-tokens 100000 --progress none", "exceeds the context"},
      {"generate " + model + " --ids 1 --bogus 3", "unknown option '--bogus'"},
      {"generate /nonexistent/model --ids 1", "config.json"},
      {"generate " + model, "--ids is required"},
      {"generate " + model + " --ids 1 --threads many", "--threads"},
      {"generate " + model + " --ids 1 --progress none --kv-cache-dtype fp8", "--kv-cache-dtype='fp8': expected auto, fp32"},
      {"generate " + model + " --ids 1 --progress none --kv-cache-dtype bogus", "--kv-cache-dtype='bogus'"},
      {"generate " + test::fixture_model("tiny-deepseekv3") + " --ids 1 --progress none --kv-cache-dtype bf16", "multi-head-latent KV cache is kept in fp32"},
  };
  for (const auto& c : cases) {
    Run r = run(c.args);
    CHECK_MESSAGE(r.code == 1, c.args << " -> " << r.out);
    CHECK_MESSAGE(contains(r.out, c.needle), c.args << " -> " << r.out);
  }
  const std::string env_cmd = "env HMOE_THREADS=lots " + std::string(HMOE_BINARY_DIR) + "/bin/hmoe generate " + model + " --ids 1 2>&1";
  FILE* p = popen(env_cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  CHECK(WEXITSTATUS(pclose(p)) == 1);
  CHECK(contains(out, "HMOE_THREADS"));
}

TEST_CASE("hmoe generate --json on the fixture prints the documented object") {
  const std::string model = test::fixture_model("tiny-qwen3moe");
  Run r = run("generate " + model + " --ids 151644,872,198 --max-tokens 3 --top-logits 5 --json --progress none");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{'), r.out.find('\n', r.out.find('{')) - r.out.find('{')));
  CHECK(j["prompt"].size() == 3);
  CHECK(j["prompt"][0]["top_ids"].size() == 5);
  CHECK(j["prompt"][0].contains("logsumexp"));
  CHECK(j["ids"].size() == 3);
  CHECK(j["steps"].size() == 3);
  CHECK(j["steps"][0]["top_logits"].size() == 5);
}

TEST_CASE("configs/SETTINGS.md is generated from the settings table") {
  const std::string path = std::string(HMOE_SOURCE_DIR) + "/configs/SETTINGS.md";
  const std::string file = test::read_file(path);
  const std::string table = settings_markdown();
  CHECK_MESSAGE(file.find(table) != std::string::npos,
                path << " is out of date: regenerate it with `build/bin/hmoe settings --markdown > configs/SETTINGS.md`");
}

TEST_CASE("hmoe plan takes a GGUF file and counts its CPU experts as stored (Q8_0), the safetensors twin's as bf16") {
  const std::string flags = " --gpu-memory 24GiB --cpu-bandwidth 50GB --gpu-resident-moe-layers none";
  const Run g = run("plan " + test::fixture_ref("tiny-qwen3moe-Q8_0.gguf") + flags);
  CHECK_MESSAGE(g.code == 0, g.out);
  // 4 MoE layers x 16 experts x 3 x 64 x 32 weights: 408 KiB at 34 bytes per 32 (Q8_0), 768 KiB in bf16.
  CHECK_MESSAGE(contains(g.out, "experts 408.0 KiB (as stored: 1.0625 bytes per weight"), g.out);
  // Resident, the Q8_0 experts stay Q8_0 on the GPU with rows padded to 16 bytes: 80 bytes per 64 columns
  // (gate/up) and 48 per 32 (down), 1.3333 bytes per weight on average.
  CHECK_MESSAGE(contains(g.out, "resident on the GPU 1.3333 bytes per weight"), g.out);
  // Long prompts stream the GGUF experts in their GPU format (2 slots, as many bytes per weight as resident).
  CHECK_MESSAGE(contains(g.out, "prefill streaming of non-resident experts: window 1 (default), 2 device slots of "), g.out);
  CHECK_MESSAGE(contains(g.out, "on the GPU when on (experts streamed in their GPU quantized format"), g.out);
  CHECK_MESSAGE(contains(g.out, "auto: break-even"), g.out);
  CHECK_MESSAGE(contains(g.out, "one of the model's experts, measured here"), g.out);
  CHECK_MESSAGE(contains(g.out, "at 1.0625 bytes/weight, pinned PCIe "), g.out);
  CHECK_MESSAGE(contains(g.out, "bytes/weight streamed"), g.out);
  CHECK_MESSAGE(!contains(g.out, "at 2.0000 bytes/weight streamed"), g.out);
  CHECK_MESSAGE(contains(g.out, "per streamed layer, CPU experts vs streamed: 128 tokens"), g.out);
  // --gpu-quantized-experts 0 streams bf16 slots (16 x 3 x 64 x 32 x 2 bytes); --gpu-prefill-min-batch-size 0 never streams.
  const Run gb = run("plan " + test::fixture_ref("tiny-qwen3moe-Q8_0.gguf") + flags + " --pcie-bandwidth 25GB --gpu-quantized-experts 0");
  CHECK_MESSAGE(contains(gb.out, "device slots of 192.0 KiB = 384.0 KiB on the GPU when on (experts streamed as bf16)"), gb.out);
  const Run g0 = run("plan " + test::fixture_ref("tiny-qwen3moe-Q8_0.gguf") + flags + " --gpu-prefill-min-batch-size 0");
  CHECK_MESSAGE(contains(g0.out, "passes of >= 0 tokens stream ("), g0.out);
  CHECK_MESSAGE(contains(g0.out, "): never"), g0.out);
  const Run gbad = run("plan " + test::fixture_ref("tiny-qwen3moe-Q8_0.gguf") + flags + " --gpu-prefill-min-batch-size soon");
  CHECK(gbad.code != 0);
  CHECK_MESSAGE(contains(gbad.out, "--gpu-prefill-min-batch-size='soon'"), gbad.out);
  const Run h = run("plan " + test::fixture_model("tiny-qwen3moe") + flags);
  CHECK_MESSAGE(h.code == 0, h.out);
  CHECK_MESSAGE(contains(h.out, "experts 768.0 KiB\n"), h.out);
  const Run bad = run("plan " + test::fixture_ref("llamacpp_q8_0_reference.json") + flags);
  CHECK(bad.code != 0);
}

TEST_CASE("--dtype / HMOE_DTYPE change the host bytes that hmoe plan and the load summary of generate show") {
  const std::string model = " " + test::fixture_model("tiny-qwen3moe");
  const std::string flags = " --gpu-memory 24GiB --cpu-bandwidth 50GB --gpu-resident-moe-layers none";
  // 4 MoE layers x 16 experts x 3 x 64 x 32 weights: 768 KiB as stored (bf16), twice that in f32.
  const Run as_stored = run("plan" + model + flags);
  CHECK_MESSAGE(contains(as_stored.out, "experts 768.0 KiB\n"), as_stored.out);
  const Run f32 = run("plan" + model + flags + " --dtype f32");
  CHECK_MESSAGE(contains(f32.out, "experts 1.5 MiB (f32: --dtype)\n"), f32.out);
  const Run env = run_env("HMOE_DTYPE=f32", "plan" + model + flags);
  CHECK_MESSAGE(contains(env.out, "experts 1.5 MiB (f32: environment variable HMOE_DTYPE)\n"), env.out);
  // The load summary of generate (serve loads the same way: tests/server/test_serve_dtype.cpp).
  auto host_bytes = [](const std::string& out) {
    const size_t b = out.find(" on the GPU, "), e = out.find(" in host memory (dtype ");
    return b == std::string::npos || e == std::string::npos ? std::string("?") : out.substr(b + 13, e - b - 13);
  };
  const std::string gen = "generate" + model + " --ids 151644,872,198 --max-tokens 1 --device cpu --progress lines";
  const Run g_auto = run(gen), g_f32 = run(gen + " --dtype f32"), g_env = run_env("HMOE_DTYPE=f32", gen);
  REQUIRE_MESSAGE(g_auto.code == 0, g_auto.out);
  CHECK_MESSAGE(contains(g_auto.out, "in host memory (dtype auto); host RSS "), g_auto.out);
  CHECK_MESSAGE(contains(g_f32.out, "in host memory (dtype f32); host RSS "), g_f32.out);
  CHECK_MESSAGE(contains(g_env.out, "in host memory (dtype f32); host RSS "), g_env.out);
  MESSAGE("generate host weights: auto " << host_bytes(g_auto.out) << ", f32 " << host_bytes(g_f32.out));
  CHECK(host_bytes(g_auto.out) != host_bytes(g_f32.out));
  CHECK(host_bytes(g_f32.out) == host_bytes(g_env.out));
}

TEST_CASE("hmoe plan says when the prefill streaming slots would not fit the GPU the plan leaves") {
  const std::string model = " " + test::fixture_model("tiny-deepseekv3") + " --cpu-bandwidth 50GB --gpu-resident-moe-layers none --pcie-bandwidth 25GB";
  const Run roomy = run("plan" + model + " --gpu-memory 24GiB");
  CHECK_MESSAGE(roomy.code == 0, roomy.out);
  CHECK_MESSAGE(contains(roomy.out, "2 device slots of 192.0 KiB"), roomy.out);
  CHECK_MESSAGE(!contains(roomy.out, "NOT ON"), roomy.out);
  // The step's room (expert_stream_step_room: 128 MiB + 0.5% of the card + the routing lists; the buffers are the
  // stack's) fits a 1 GiB card beside a 305 MiB workspace, not a 450 MiB one.
  const Run fits = run("plan" + model + " --gpu-memory 1GiB");
  CHECK_MESSAGE(fits.code == 0, fits.out);
  CHECK_MESSAGE(!contains(fits.out, "NOT ON"), fits.out);
  const Run tight = run("plan" + model + " --gpu-memory 450MiB");
  CHECK_MESSAGE(tight.code == 0, tight.out);
  CHECK_MESSAGE(contains(tight.out, "NOT ON with this plan: the expert slots need 384.0 KiB"), tight.out);
  const Run off = run("plan" + model + " --gpu-memory 450MiB --gpu-prefill-min-batch-size 0");
  CHECK_MESSAGE(!contains(off.out, "NOT ON"), off.out);
}

TEST_CASE("hmoe plan of an Engram checkpoint: where each PLE table is served from and the reads the file must serve") {
  const std::string model = " " + test::fixture_model("tiny-qwen3moe-engram") + " --gpu-memory 24GiB --cpu-bandwidth 50GB";
  const Run r = run("plan" + model);
  CHECK_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(contains(r.out, "PLE n-gram tables (--ple-backend io_uring): 2 modules"), r.out);
  CHECK_MESSAGE(contains(r.out, "module 0 before layer 1: "), r.out);
  CHECK_MESSAGE(contains(r.out, "read from the table file"), r.out);
  CHECK_MESSAGE(contains(r.out, "random reads per token"), r.out);
  CHECK_MESSAGE(contains(r.out, "--ple-ram-modules 0 keeps its table"), r.out);
  const Run ram0 = run("plan" + model + " --ple-ram-modules 0");
  CHECK_MESSAGE(ram0.code == 0, ram0.out);
  CHECK_MESSAGE(contains(ram0.out, "in RAM (--ple-ram-modules)"), ram0.out);
  CHECK_MESSAGE(!contains(ram0.out, "--ple-ram-modules 0 keeps its table"), ram0.out);
  const Run bad = run("plan" + model + " --ple-ram-modules 7");
  CHECK(bad.code != 0);
  CHECK_MESSAGE(contains(bad.out, "HMOE_PLE_RAM_MODULES"), bad.out);
}

TEST_CASE("hmoe bench disk probes a file's random reads; bad paths and options are errors naming them") {
  test::TempDir tmp("bench-disk");
  const std::string file = tmp.str() + "/data.bin";
  std::string bytes(4 << 20, '\0');
  uint64_t x = 88172645463325252ull;
  for (auto& c : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  test::write_file(file, bytes);
  const Run r = run("bench disk " + file + " --seconds 0.3");
  CHECK_MESSAGE(r.code == 0, r.out);
  CHECK_MESSAGE(contains(r.out, "queue depth 64 over 4 rings: "), r.out);
  CHECK_MESSAGE(contains(r.out, "16 reads at once (one PLE module's rows for one token)"), r.out);
  const Run j = run("bench disk " + file + " --seconds 0.2 --group 8 --block 4096 --json");
  REQUIRE_MESSAGE(j.code == 0, j.out);
  const auto js = nlohmann::json::parse(j.out.substr(j.out.find('{')));
  CHECK(js["bytes"] == 4 << 20);
  CHECK(js["block"] == 4096);
  CHECK(js["group"] == 8);
  CHECK(js["iops"].get<double>() > 0);
  CHECK(js["group_p50_us"].get<double>() > 0);
  CHECK(js["group_p90_us"].get<double>() >= js["group_p50_us"].get<double>());
  struct Bad {
    std::string args, says;
  };
  for (const Bad& b : {Bad{"bench disk " + tmp.str(), "is a directory"}, Bad{"bench disk " + tmp.str() + "/missing.bin", "missing.bin"},
                       Bad{"bench disk " + file + " --block 1000", "power of two"}, Bad{"bench disk " + file + " --group 0", "group"},
                       Bad{"bench disk " + file + " --seconds 0", "seconds"}, Bad{"bench disk", "one FILE"}, Bad{"bench floppy", "floppy"}}) {
    const Run e = run(b.args);
    CHECK_MESSAGE(e.code != 0, b.args << ": " << e.out);
    CHECK_MESSAGE(contains(e.out, b.says), b.args << ": " << e.out);
  }
  // A file smaller than one block.
  test::write_file(tmp.str() + "/tiny.bin", "abc");
  const Run t = run("bench disk " + tmp.str() + "/tiny.bin");
  CHECK(t.code != 0);
  CHECK_MESSAGE(contains(t.out, "less than one 512-byte block"), t.out);
}

TEST_CASE("an HMOE_ environment variable that is no setting is named in a warning, with the nearest setting") {
  const Run r = run_env("HMOE_GPU_RESIDENT_MOE_LAYER=0-3 HMOE_ZZZ=1", "settings");
  CHECK(r.code == 0);
  CHECK_MESSAGE(contains(r.out, "warning: environment variable HMOE_GPU_RESIDENT_MOE_LAYER is not an hmoe setting and is ignored "
                                "(did you mean HMOE_GPU_RESIDENT_MOE_LAYERS?)"),
                r.out);
  CHECK(contains(r.out, "environment variable HMOE_ZZZ is not an hmoe setting and is ignored;"));
  CHECK(!contains(r.out, "HMOE_ZZZ is not an hmoe setting and is ignored (did you mean"));
  const Run ok = run_env("HMOE_GPU_RESIDENT_MOE_LAYERS=0-3 HMOE_CUDA=OFF", "settings");
  CHECK(ok.code == 0);
  CHECK(!contains(ok.out, "warning: environment variable"));
}

TEST_CASE("hmoe bench MODEL: prefill and decode tok/s of a GGUF file, as serve runs it, in JSON and markdown") {
  const std::string gguf = test::fixture_ref("tiny-qwen3moe-Q8_0.gguf");
  const Run j = run("bench " + gguf + " -p 16,40 -n 4 --batch 1,3 -d 0,20 -r 2 --threads 2 --max-num-batched-tokens 16 --seed 7 --json");
  REQUIRE_MESSAGE(j.code == 0, j.out);
  const auto js = nlohmann::json::parse(j.out.substr(j.out.rfind("\n{") + 1));
  CHECK(js["device"] == "cpu");
  CHECK(js["prefill_chunk"] == 16);
  CHECK(js["repetitions"] == 2);
  CHECK(js["warmup_runs"] == 1);
  CHECK(js["seed"] == 7);
  CHECK(js["layers"] == 4);
  const auto& res = js["results"];
  REQUIRE(res.size() == 8);  // per depth: pp16, pp40, tg4 x batch 1 and 3
  const std::vector<std::string> names = {"pp16", "pp40", "tg4", "tg4", "pp16 @ d20", "pp40 @ d20", "tg4 @ d20", "tg4 @ d20"};
  for (size_t i = 0; i < res.size(); ++i) {
    const auto& r = res[i];
    CHECK(r["test"] == names[i]);
    REQUIRE(r["samples_s"].size() == 2);
    REQUIRE(r["samples_ts"].size() == 2);
    const double t0 = r["samples_s"][0], t1 = r["samples_s"][1];
    CHECK(t0 > 0);
    CHECK(t1 > 0);
    const int64_t tokens = r["tokens"];
    // tok/s is tokens over seconds per repetition, averaged; sd is the sample standard deviation.
    CHECK(r["samples_ts"][0].get<double>() == doctest::Approx(static_cast<double>(tokens) / t0));
    const double a = tokens / t0, b = tokens / t1;
    CHECK(r["avg_ts"].get<double>() == doctest::Approx((a + b) / 2));
    CHECK(r["stddev_ts"].get<double>() == doctest::Approx(std::abs(a - b) / std::sqrt(2.0)));
    CHECK(!r.contains("gpu_times"));  // CPU path
  }
  CHECK(res[1]["kind"] == "prefill");
  CHECK(res[1]["tokens"] == 40);
  CHECK(res[1]["context_start"] == 0);
  CHECK(res[1]["context_end"] == 40);
  CHECK(res[3]["kind"] == "decode");
  CHECK(res[3]["batch"] == 3);
  CHECK(res[3]["tokens"] == 12);  // 4 steps of 3 sequences
  CHECK(res[7]["context_start"] == 20);
  CHECK(res[7]["context_end"] == 24);

  const Run md = run("bench " + gguf + " -p 24 -n 3 --batch 2 -r 1 --threads 1");
  CHECK_MESSAGE(md.code == 0, md.out);
  CHECK_MESSAGE(contains(md.out, "| test | batch | context | tok/s | +- sd |"), md.out);
  CHECK_MESSAGE(contains(md.out, "| pp24 | 1 | 0-24 | "), md.out);
  CHECK_MESSAGE(contains(md.out, "| tg3 | 2 | 0-3 | "), md.out);
  CHECK_MESSAGE(contains(md.out, "prefill in chunks of 2048 tokens (--max-num-batched-tokens, as serve)"), md.out);
  CHECK_MESSAGE(contains(md.out, "1 repetitions after one warm-up"), md.out);
}

TEST_CASE("hmoe bench MODEL runs a Hugging Face directory; bad options are errors naming them") {
  const std::string hf = test::fixture_model("tiny-qwen3moe");
  const Run r = run("bench " + hf + " -p 8 -n 2 --batch 2 -r 1 --threads 1 --json");
  REQUIRE_MESSAGE(r.code == 0, r.out);
  const auto js = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  CHECK(js["results"].size() == 2);
  CHECK(js["results"][1]["test"] == "tg2");
  struct Bad {
    std::string args, says;
  };
  const std::string m = std::string(1, ' ').append(test::fixture_ref("tiny-qwen3moe-Q8_0.gguf"));
  for (const Bad& b : {Bad{"bench", "name a MODEL"}, Bad{"bench" + m + " -p 8,x", "-p/--n-prompt element: expected an integer, got 'x'"},
                       Bad{"bench" + m + " -p 8,", "empty element"}, Bad{"bench" + m + " -n -3", "-n/--n-gen: -3 is out of range"},
                       Bad{"bench" + m + " -r 0", "-r/--repetitions must be in 1..1000"}, Bad{"bench" + m + " --batch 0", "--batch: 0 is out of range"},
                       Bad{"bench" + m + " -p 0 -n 0", "nothing to measure"}, Bad{"bench" + m + " -q 3", "unknown option '-q'"},
                       Bad{"bench" + m + " -r", "-r: missing value"}, Bad{"bench" + m + " -p 8 --n-prompt 9", "given twice"},
                       Bad{"bench" + m + " extra", "got 2 positional arguments"}, Bad{"bench /nonexistent/dir -p 8", "/nonexistent/dir"},
                       Bad{"bench" + m + " -p 8 -d 5000", "exceeds the context length 4096"},
                       Bad{"bench" + m + " -p 8 --block-size 12", "--block-size=12: expected 1..65536; 0 or a power of two"},
                       Bad{"bench" + m + " -p 8 --max-num-batched-tokens 0", "--max-num-batched-tokens=0: expected 1..1073741824"}}) {
    const Run e = run(b.args);
    CHECK_MESSAGE(e.code != 0, b.args << ": " << e.out);
    CHECK_MESSAGE(contains(e.out, b.says), b.args << ": " << e.out);
  }
}

TEST_CASE("hmoe plan --context/--batch/--trace, bench trace and bench cache-sim: the fit table, the hit rates, bad inputs named") {
  const std::string model = " " + test::fixture_model("tiny-qwen3moe") + " --cpu-bandwidth 50GB --gpu-bandwidth 1TB --pcie-bandwidth 25GB";
  const Run p = run("plan" + model + " --gpu-memory 24GiB --context 4096 --batch 2");
  CHECK_MESSAGE(p.code == 0, p.out);
  CHECK_MESSAGE(contains(p.out, "automatic fit: budget "), p.out);
  CHECK_MESSAGE(contains(p.out, "decode batch 2, context 4096 tokens per sequence"), p.out);
  CHECK_MESSAGE(contains(p.out, "**chosen**"), p.out);
  CHECK_MESSAGE(contains(p.out, "auto: 4 resident MoE layers (all)"), p.out);
  for (const char* bad : {" --context 0", " --batch 0", " --batch many", " --gpu-memory 1.5XB", " --defer-experts -2"}) {
    const Run b = run("plan" + model + bad);
    CHECK_MESSAGE(b.code != 0, bad);
    CHECK_MESSAGE(contains(b.out, std::string(bad).substr(1, std::string(bad).find(' ', 1) - 1)), b.out);
  }
  const Run missing = run("plan" + model + " --trace /nonexistent-trace.bin");
  CHECK(missing.code != 0);
  CHECK_MESSAGE(contains(missing.out, "routing trace '/nonexistent-trace.bin' cannot be opened"), missing.out);
  const std::string trace = std::string(HMOE_BINARY_DIR) + "/cli_zipf_trace.bin";
  const Run t = run("bench trace --zipf 1.0 --experts 16 --topk 4 --layers 4 --tokens 200 --hidden 64 --moe-intermediate 32 --out " + trace);
  CHECK_MESSAGE(t.code == 0, t.out);
  CHECK_MESSAGE(contains(t.out, "200 steps x 4 layers"), t.out);
  const Run pt = run("plan" + model + " --gpu-memory 24GiB --trace " + trace);
  CHECK_MESSAGE(pt.code == 0, pt.out);
  CHECK_MESSAGE(contains(pt.out, "hit rates from routing trace"), pt.out);
  // The setting the automatic fit of a run reads (--fit-routing-trace / HMOE_FIT_ROUTING_TRACE): plan takes it too.
  const Run pf = run("plan" + model + " --gpu-memory 24GiB --fit-routing-trace " + trace);
  CHECK_MESSAGE(pf.code == 0, pf.out);
  CHECK_MESSAGE(contains(pf.out, "hit rates from routing trace"), pf.out);
  const Run pfm = run("plan" + model + " --gpu-memory 24GiB --fit-routing-trace /nonexistent-trace.bin");
  CHECK(pfm.code != 0);
  CHECK_MESSAGE(contains(pfm.out, "routing trace '/nonexistent-trace.bin' cannot be opened"), pfm.out);
  const Run sim = run("bench cache-sim " + trace + " --bytes 48KiB,96KiB");
  CHECK_MESSAGE(sim.code == 0, sim.out);
  CHECK_MESSAGE(contains(sim.out, "| 48.0 KiB | 4 | 6.2% | lru |"), sim.out);
  CHECK_MESSAGE(contains(sim.out, "| 96.0 KiB | 8 | 12.5% | freq_recency |"), sim.out);
  const Run js = run("bench cache-sim " + trace + " --bytes 96KiB --policy lfu --json");
  CHECK_MESSAGE(contains(js.out, "\"policy\":\"lfu\""), js.out);
  CHECK_MESSAGE(contains(js.out, "\"partition\":\"per_layer\""), js.out);
  const Run gl = run("bench cache-sim " + trace + " --bytes 96KiB --partition global");
  CHECK_MESSAGE(gl.code == 0, gl.out);
  CHECK_MESSAGE(contains(gl.out, "one pool over all layers"), gl.out);
  const Run pol = run("plan" + model + " --gpu-memory 24GiB --trace " + trace + " --gpu-expert-cache-policy lru");
  CHECK_MESSAGE(contains(pol.out, "lru policy per layer"), pol.out);
  const Run badpol = run("plan" + model + " --gpu-expert-cache-policy fifo");
  CHECK(badpol.code != 0);
  CHECK_MESSAGE(contains(badpol.out, "--gpu-expert-cache-policy"), badpol.out);
  struct Bad {
    const char* args;
    const char* says;
  };
  for (const Bad& b : {Bad{"bench trace --experts 16 --topk 4 --layers 4 --tokens 10 --out x", "--zipf S is required"},
                       Bad{"bench trace --zipf -1 --experts 16 --topk 4 --layers 4 --tokens 10 --out x", "--zipf=-1"},
                       Bad{"bench trace --zipf 1 --experts 16 --topk 17 --layers 4 --tokens 10 --out x", "--topk=17"},
                       Bad{"bench trace --zipf 1 --experts 16 --topk 4 --layers 4 --tokens 10", "--out FILE is required"},
                       Bad{"bench trace --zipf 1 --experts 16 --topk 4 --layers 4 --tokens 10 --out /nonexistent-dir/t.bin", "/nonexistent-dir/t.bin"},
                       Bad{"bench cache-sim /nonexistent-trace.bin --bytes 1GiB", "/nonexistent-trace.bin"},
                       Bad{"bench cache-sim --bytes 1GiB", "takes one TRACE"},
                       Bad{"bench cache-sim TRACE", "--bytes SIZE"},
                       Bad{"bench cache-sim TRACE --bytes 1GiB --policy fifo", "--policy='fifo'"},
                       Bad{"bench cache-sim TRACE --bytes 1GiB --partition pooled", "--partition='pooled'"},
                       Bad{"bench cache-sim TRACE --bytes 1GiB --layers 9", "layer 9"},
                       Bad{"bench cache-sim TRACE --bytes 1GiB --bytes-per-weight 0", "--bytes-per-weight=0"}}) {
    std::string a = b.args;
    if (const size_t at = a.find("TRACE"); at != std::string::npos) a.replace(at, 5, trace);
    const Run r = run(a);
    CHECK_MESSAGE(r.code != 0, a);
    CHECK_MESSAGE(contains(r.out, b.says), a << ": " << r.out);
  }
  std::remove(trace.c_str());
}
