// The placement plan's device index per layer (the seam pipeline parallel,
// issue 10, fills): make_plan puts every layer on GPU 0, `hmoe plan` prints
// it, and the GPU runtime checks the indices it is given against the
// machine before it allocates anything: an index that is no GPU here is a
// clear error naming the layer, the index and the GPUs there are. Runs on
// the CPU build too (no GPU: every index is out of range).
#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "configs/error.h"
#include "engine/layers/weights.h"
#include "engine/loading/model_config.h"
#include "engine/models/model_graph.h"
#include "engine/placement/placement.h"
#include "engine/runtime/gpu_runtime.h"
#include "gpu/device.h"
#include "io/safetensors.h"
#include "numa/node_pools.h"
#include "tests/test_util.h"

using namespace hmoe;

namespace {

std::string error_of(const std::function<void()>& fn, ErrorKind kind) {
  try {
    fn();
  } catch (const Error& e) {
    CHECK(e.kind() == kind);
    return e.what();
  }
  FAIL("no error");
  return "";
}

}  // namespace

TEST_CASE("plan devices: every layer on GPU 0; an index that is no GPU of this machine is an error naming layer and index") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE_MESSAGE(std::filesystem::exists(dir + "/config.json"), "fixture missing in " << dir << ": run scripts/make-fixtures");
  const ModelConfig c = ModelConfig::from_dir(dir);
  Settings s = Settings::defaults();
  s.gpu_resident_moe_layers = "all";
  const Plan p = make_plan(c, s, GpuTarget{"a test GPU", 24ull << 30, 1e12, true});
  REQUIRE(static_cast<int64_t>(p.devices().size()) == c.num_hidden_layers);
  for (int d : p.devices()) CHECK(d == 0);
  check_layer_devices(p.devices(), 1);

  std::vector<int> bad = p.devices();
  bad[2] = 3;
  CHECK(error_of([&] { check_layer_devices(bad, 1); }, ErrorKind::invalid_argument) ==
        "placement puts layer 2 on GPU 3, but this machine has 1 GPU (GPU 0)");
  CHECK(error_of([&] { check_layer_devices(p.devices(), 0); }, ErrorKind::invalid_argument) ==
        "placement puts layer 0 on GPU 0, but this machine has no GPU");
  bad[2] = -1;
  CHECK(error_of([&] { check_layer_devices(bad, 4); }, ErrorKind::invalid_argument).find("layer 2 on GPU -1, but this machine has 4 GPUs (0..3)") !=
        std::string::npos);
  bad[2] = 1;  // a GPU that exists, but not the one the runtime runs on
  CHECK(error_of([&] { check_layer_devices(bad, 2); }, ErrorKind::unsupported).find("pipeline parallel (issue 10)") != std::string::npos);
}

TEST_CASE("plan devices: the GPU runtime refuses a layer placed on a GPU this machine lacks, before allocating") {
  const std::string dir = test::fixture_model("tiny-qwen3moe");
  REQUIRE(std::filesystem::exists(dir + "/config.json"));
  const ModelConfig c = ModelConfig::from_dir(dir);
  io::TensorStore store(dir);
  WeightBinder bind(&store, nullptr);
  const ModelGraph g = model_graph(c, [&bind](const std::string& name) { return bind.has(name); });
  numa::PoolOptions po;
  po.threads = 1;
  numa::NodePools pools(po);
  GpuRuntimeOptions o;
  o.resident.assign(static_cast<size_t>(c.num_hidden_layers), true);
  o.devices.assign(static_cast<size_t>(c.num_hidden_layers), 0);
  o.devices[1] = 7;
  const int n = gpu::device_count();
  const std::string e = error_of([&] { GpuRuntime rt(c, g, bind, pools, o); }, ErrorKind::invalid_argument);
  MESSAGE(e);
  // Without a GPU every index is out of range, and layer 0 is named first.
  CHECK(e == (n == 0 ? std::string("placement puts layer 0 on GPU 0, but this machine has no GPU")
                     : "placement puts layer 1 on GPU 7, but this machine has " + std::string(n == 1 ? "1 GPU (GPU 0)" : std::to_string(n) + " GPUs (0.." + std::to_string(n - 1) + ")")));
}
