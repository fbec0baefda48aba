// The loader loads what the placement plan says and no more: an all-GPU
// run keeps no host copy of the weights it uploaded (their checkpoint pages
// are dropped as they go up), a run with host experts keeps exactly the
// plan's host expert bytes, and the load report carries the host RSS before
// and after loading (printed by the load summary line).
#include <doctest/doctest.h>

#include <filesystem>

#include "engine/loading/model.h"
#include "engine/placement/placement.h"
#include "gpu/device.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::unique_ptr<Model> load_on_gpu(const std::string& dir, const std::string& resident) {
  std::vector<std::string> args = {"--device", "cuda", "--progress", "none", "--gpu-resident-moe-layers", resident, "--threads", "2"};
  return Model::load(dir, Settings::load(args));
}

void report(const std::string& what, const Model& m) {
  const LoadReport& r = m.load_report();
  MESSAGE(what << ": weights " << r.gpu_weight_bytes << " B on the GPU, " << r.host_weight_bytes << " B in host memory; host RSS "
               << r.rss_before / 1048576.0 << " MiB before loading (peak " << r.peak_rss_before / 1048576.0 << "), " << r.rss_after / 1048576.0
               << " MiB after (peak " << r.peak_rss_after / 1048576.0 << ")");
}

}  // namespace

TEST_CASE("all-GPU runs keep no host copy of the uploaded weights; partial runs keep exactly the plan's host experts") {
  if (!test::have_gpu()) return;
  for (const char* name : {"tiny-qwen3moe", "tiny-deepseekv3"}) {
    const std::string dir = test::fixture_model(name);
    REQUIRE_MESSAGE(std::filesystem::exists(dir + "/config.json"), "fixture missing in " << dir);
    auto all = load_on_gpu(dir, "all");
    report(std::string(name) + ", all layers resident", *all);
    REQUIRE(all->gpu() != nullptr);
    CHECK(all->load_report().host_weight_bytes == 0);
    CHECK(all->host_weight_bytes() == 0);
    CHECK(all->load_report().gpu_weight_bytes > 0);

    auto none = load_on_gpu(dir, "none");
    report(std::string(name) + ", no MoE layer resident", *none);
    std::vector<std::string> args = {"--gpu-resident-moe-layers", "none"};
    const Settings s = Settings::load(args);
    const gpu::DeviceInfo d = gpu::device_info(0);
    const Plan p = make_plan(none->config(), s, GpuTarget{d.name, d.total_bytes, 0, false});
    CHECK(none->load_report().host_weight_bytes == p.cpu_expert_bytes);
    CHECK(none->load_report().gpu_weight_bytes < all->load_report().gpu_weight_bytes);
  }
}
