// `hmoe plan` on a GGUF file (engine/gguf_plan.h).
#include "engine/loading/gguf_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "engine/placement/placement.h"
#include "io/gguf.h"

namespace hmoe {

namespace {

std::string type_name(uint32_t t) {
  const io::GgmlTypeInfo* ti = io::ggml_type_info(t);
  std::string n = ti ? ti->name : "type" + std::to_string(t);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return n;
}

// Block index of a tensor name "blk.N.*", or -1.
int64_t block_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int64_t n = 0;
  size_t i = 4;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) n = n * 10 + (name[i] - '0');
  return i > 4 && i < name.size() && name[i] == '.' ? n : -1;
}

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b) / (1 << 20));
  return buf;
}

}  // namespace

std::string gguf_layer_bytes_report(const io::GgufFile& f) {
  struct Row {
    std::map<std::string, uint64_t> by_type;
    uint64_t total = 0, experts = 0;
  };
  std::map<int64_t, Row> rows;  // -1: outside the blocks
  std::map<std::string, uint64_t> type_total;
  for (const io::GgufTensor& t : f.tensors()) {
    Row& r = rows[block_of(t.name)];
    const std::string tn = type_name(t.type);
    r.by_type[tn] += t.bytes;
    r.total += t.bytes;
    if (t.name.find("_exps.") != std::string_view::npos) r.experts += t.bytes;
    type_total[tn] += t.bytes;
  }
  std::vector<std::string> types;
  for (const auto& [n, b] : type_total) types.push_back(n);
  std::sort(types.begin(), types.end(), [&](const std::string& a, const std::string& b) { return type_total[a] > type_total[b]; });
  std::string out = "\nbytes per layer by tensor type, as stored (MiB):\n\n| layer | total | routed experts |";
  for (const auto& t : types) out += " " + t + " |";
  out += "\n|---|---|---|";
  for (size_t i = 0; i < types.size(); ++i) out += "---|";
  out += "\n";
  Row all;
  for (const auto& [l, r] : rows) {
    out += "| " + (l < 0 ? std::string("(embeddings, output)") : std::to_string(l)) + " | " + mib(r.total) + " | " + (r.experts ? mib(r.experts) : "-") + " |";
    for (const auto& t : types) {
      const auto it = r.by_type.find(t);
      out += " " + (it == r.by_type.end() ? std::string("-") : mib(it->second)) + " |";
    }
    out += "\n";
    all.total += r.total;
    all.experts += r.experts;
  }
  out += "| all | " + mib(all.total) + " | " + mib(all.experts) + " |";
  for (const auto& t : types) out += " " + mib(type_total[t]) + " |";
  return out + "\n";
}

std::string gguf_fit_report(const io::GgufFile& f, const Plan& p, uint64_t gpu_total_bytes) {
  uint64_t total = 0, experts = 0;
  for (const io::GgufTensor& t : f.tensors()) {
    total += t.bytes;
    if (t.name.find("_exps.") != std::string_view::npos) experts += t.bytes;
  }
  std::string out = "\nfit on " + format_bytes(gpu_total_bytes) + ": the file holds " + format_bytes(total) + " (routed experts " + format_bytes(experts) +
                    ", the rest " + format_bytes(total - experts) + "); the GPU takes the rest as " + format_bytes(p.gpu_fixed_bytes) +
                    " and the routed experts of " + std::to_string(p.resident_moe_layers()) + " of " + std::to_string(p.moe_layers()) +
                    " MoE layers (" + format_bytes(p.gpu_expert_bytes) + "); host memory keeps " + format_bytes(p.cpu_expert_bytes) + " of experts.\n";
  if (p.resident_moe_layers() == p.moe_layers()) out += "everything fits on the GPU.\n";
  return out;
}

}  // namespace hmoe
