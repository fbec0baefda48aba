// `hmoe render-chat MODEL --request F` prints exactly transformers' text for
// every chat of the Qwen3 fixture's hf_reference.json.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

TEST_CASE("hmoe render-chat equals hf_reference.json texts") {
  std::string hmoe = std::string(HMOE_BINARY_DIR) + "/bin/hmoe";
  REQUIRE_MESSAGE(std::filesystem::exists(hmoe), "build the hmoe target first: " << hmoe);
  std::string model = std::string(HMOE_FIXTURES_DIR) + "/tiny-qwen3moe";
  std::ifstream f(model + "/hf_reference.json");
  REQUIRE(f.good());
  auto ref = nlohmann::ordered_json::parse(f);
  auto req_path = std::filesystem::temp_directory_path() / ("hmoe_render_chat_" + std::to_string(::getpid()) + ".json");
  int n = 0;
  for (auto& chat : ref["chats"]) {
    nlohmann::ordered_json req = {{"messages", chat["messages"]},
                                  {"tools", chat["tools"]},
                                  {"chat_template_kwargs", {{"enable_thinking", chat["enable_thinking"]}}}};
    std::ofstream(req_path) << req.dump();
    std::string cmd = "'" + hmoe + "' render-chat '" + model + "' --request '" + req_path.string() + "'";
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
    std::string out;
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, k);
    CAPTURE(n);
    CHECK(out == chat["text"].get<std::string>());
    ++n;
  }
  std::filesystem::remove(req_path);
  CHECK(n == 4);
}
