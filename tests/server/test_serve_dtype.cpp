// --dtype / HMOE_DTYPE reaches `serve` as it reaches `generate`: the server
// loads its model with the setting (server::make_server -> Model::load), so
// the host bytes of the load report follow it (the bf16 fixture held as f32
// takes twice the bytes; bf16 keeps it as stored).
#include <doctest/doctest.h>

#include "tests/server/server_fixture.h"

using namespace hmoe;

TEST_CASE("serve: --dtype changes the host weight bytes of the loaded model") {
  auto host_bytes = [](const std::string& dtype) {
    Settings s = test::test_settings();
    s.weight_dtype = dtype;
    s.device = "cpu";
    s.validate();
    const auto st = server::make_server(s, test::fixture_model("tiny-qwen3moe"));
    const LoadReport& r = st->model->load_report();
    CHECK(r.weight_dtype == dtype);
    return r.host_weight_bytes;
  };
  const uint64_t as_stored = host_bytes("auto"), f32 = host_bytes("f32"), bf16 = host_bytes("bf16");
  MESSAGE("serve host weight bytes: auto " << as_stored << ", f32 " << f32 << ", bf16 " << bf16);
  CHECK(as_stored > 0);
  CHECK(f32 == 2 * as_stored);
  CHECK(bf16 == as_stored);
}
