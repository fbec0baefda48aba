// `hmoe plan` on a file whose host experts the GPU expert cache takes
// (tests/quant_tools/gguf_models.h: Q4_K, 2 layers of 4 experts, top-2):
// the cache budget, its slots and the split decode line from the bandwidths
// given (auto by default); --gpu-expert-cache 0 says off; a bad value names the flag.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "tests/quant_tools/gguf_models.h"
#include "tests/test_util.h"

namespace {

std::string plan(const std::string& args) {
  const std::string cmd = std::string(HMOE_BINARY_DIR) + "/bin/hmoe plan " + args + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  pclose(p);
  return out;
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("hmoe plan shows the GPU expert cache and the split decode choice for GGUF K-quant host experts") {
  hmoe::test::TempDir dir("plan-expert-cache");
  const std::string path = dir.str() + "/q4k.gguf";
  hmoe::test::write_file(path, hmoe::qtools::build_model(12).quant.bytes());
  const std::string common =
      path + " --gpu-resident-moe-layers none --cpu-bandwidth 50GB --pcie-bandwidth 25GB --gpu-memory 24GiB --gpu-expert-cache-policy lru";
  // The default is auto (since it ran on an H100 under the copy residence: settings.inc), the same plan as naming it.
  // Q4_K expert: 3 matrices of 256 rows x 144 bytes = 108.0 KiB; auto = 4 x top-2 slots (8 = every expert of the 2 layers).
  const std::string a = plan(common + " --gpu-expert-cache auto");
  const std::string d = plan(common);
  CHECK_MESSAGE(has(d, "GPU expert cache (decode, host layers' experts; lru per layer): 864.0 KiB of VRAM (auto: an eighth of the host experts, at least 4 top-k sets)"), d);
  CHECK_MESSAGE(has(a, "GPU expert cache (decode, host layers' experts; lru per layer): 864.0 KiB of VRAM (auto: an eighth of the host experts, at least 4 top-k sets)"), a);
  CHECK_MESSAGE(has(a, "8 slots of 108.0 KiB = 100.0% of the 2 host layers' experts"), a);
  CHECK_MESSAGE(has(a, "split decode: every routed expert cached, the GPU computes them all"), a);
  // Two slots: a quarter of the experts; a fixed share copies half of the misses.
  const std::string b = plan(common + " --gpu-expert-cache 221184 --gpu-split-decode 0.5");
  CHECK_MESSAGE(has(b, "2 slots of 108.0 KiB = 25.0% of the 2 host layers' experts"), b);
  CHECK_MESSAGE(has(b, "split decode (fixed share, --gpu-split-decode): per host layer and token 2 of 2 experts routed, 2 missed: 1 copied over PCIe (25.0 GB/s)"), b);
  CHECK_MESSAGE(has(plan(common + " --gpu-expert-cache 0"), "GPU expert cache and split decode: off (--gpu-expert-cache 0)"), "");
  // Auto split with two slots: tiny experts (108 KiB: 2 us of host reads) are not worth a copy's 10 us fixed cost.
  const std::string c = plan(common + " --gpu-expert-cache 221184");
  CHECK_MESSAGE(has(c, "split decode (auto: balances the bandwidths): per host layer and token 2 of 2 experts routed, 2 missed: 0 copied"), c);
  CHECK_MESSAGE(has(plan(common + " --gpu-split-decode 2"), "--gpu-split-decode"), "");
  // freq_recency (the default): of the same 8 slots, 4 (two top-2 sets, half the pool) are transient.
  const std::string f = plan(common + " --gpu-expert-cache auto --gpu-expert-cache-policy freq_recency");
  CHECK_MESSAGE(has(f, "freq_recency per layer): 864.0 KiB of VRAM"), f);
  CHECK_MESSAGE(has(f, "4 slots of 108.0 KiB (+4 transient: misses the split copies that the policy does not cache) = 50.0% of the 2 host layers' experts"), f);
}
