// The host experts' residence for GPU DMA (see host_residence.h).
#include "engine/layers/host_residence.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "configs/error.h"
#include "configs/settings.h"
#include "engine/placement/placement.h"

namespace hmoe {

HostResidence parse_host_residence(const std::string& where, const std::string& v) {
  std::string s = v;
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (s == "copy") return HostResidence::copy;
  if (s == "map" || s == "1") return HostResidence::map;
  if (s == "off" || s == "0") return HostResidence::off;
  fail(ErrorKind::invalid_argument, where + "=" + v + ": expected copy, map or off (1 and 0 read as map and off)");
}

HostResidence host_residence_of(const Settings& s) {
  std::string where = s.origin("gpu_pin_host_experts");
  if (where == "default") where = "--gpu-pin-host-experts / HMOE_GPU_PIN_HOST_EXPERTS";
  return parse_host_residence(where, s.gpu_pin_host_experts);
}

const char* host_residence_name(HostResidence r) {
  switch (r) {
    case HostResidence::copy: return "copy";
    case HostResidence::map: return "map";
    case HostResidence::off: return "off";
  }
  return "?";
}

int64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

HostResidenceChoice choose_host_residence(HostResidence asked, bool gpu_reads, uint64_t bytes, uint64_t other_host_bytes, int64_t available) {
  HostResidenceChoice c;
  c.asked = asked;
  c.gpu_reads = gpu_reads;
  c.bytes = bytes;
  c.reserve = other_host_bytes + (uint64_t{1} << 30);
  c.available = available;
  if (!gpu_reads) {
    c.chosen = HostResidence::off;
    c.why = "the GPU reads no host experts (no GPU run, every MoE layer resident, or streamed prefill and the expert cache both off): nothing copied or "
            "registered; the CPU experts keep their views (or their node copies on several NUMA nodes)";
    return c;
  }
  if (asked == HostResidence::map) {
    c.chosen = HostResidence::map;
    c.why = "the checkpoint's file map registered in place (--gpu-pin-host-experts map)";
    return c;
  }
  if (asked == HostResidence::off) {
    c.chosen = HostResidence::off;
    c.why = "nothing registered: the GPU's copies read the file map as pageable memory (--gpu-pin-host-experts off)";
    return c;
  }
  if (available >= 0 && bytes + c.reserve > static_cast<uint64_t>(available)) {
    c.chosen = HostResidence::off;
    c.why = "NOT copied: the host experts (" + format_bytes(bytes) + ") and " + format_bytes(c.reserve) + " kept free need " +
            format_bytes(bytes + c.reserve) + ", MemAvailable is " + format_bytes(static_cast<uint64_t>(available)) + " (short by " +
            format_bytes(bytes + c.reserve - static_cast<uint64_t>(available)) +
            "): falling back to off, the GPU's copies read the file map as pageable memory (free host memory, keep more layers resident, or pass "
            "--gpu-pin-host-experts off to silence this)";
    return c;
  }
  c.chosen = HostResidence::copy;
  c.why = "one copy in anonymous memory per NUMA node, registered with the driver, the file's pages dropped" +
          (available >= 0 ? " (" + format_bytes(bytes) + " of " + format_bytes(static_cast<uint64_t>(available)) + " MemAvailable)" : std::string(" (MemAvailable unknown)"));
  return c;
}

std::string HostResidenceChoice::describe() const {
  return std::string("host experts for GPU DMA: ") + host_residence_name(chosen) + (chosen != asked ? std::string(" (asked ") + host_residence_name(asked) + ")" : "") +
         " - " + why;
}

std::string HostResidenceStats::describe() const {
  char buf[768];
  const double gb = static_cast<double>(copied_bytes) / 1e9, rgb = static_cast<double>(registered_bytes) / 1e9;
  std::snprintf(buf, sizeof buf,
                "host experts: copy residence: %lld layers, %s copied into node memory in %.2f s (%.1f GB/s), %s registered in %lld registrations in "
                "%.2f s (%.3f s/GB), checkpoint pages dropped: %s in %.2f s%s%s%s",
                static_cast<long long>(layers), format_bytes(copied_bytes).c_str(), copy_s, copy_s > 0 ? gb / copy_s : 0.0,
                format_bytes(registered_bytes).c_str(), static_cast<long long>(registrations), register_s, rgb > 0 ? register_s / rgb : 0.0,
                format_bytes(dropped_bytes).c_str(), drop_s,
                in_place_layers ? ("; " + std::to_string(in_place_layers) + " layers (" + format_bytes(in_place_bytes) +
                                   ") are the loader's own buffers (no file map): registered where they are, not copied").c_str()
                                : "",
                refused.empty() ? "" : "; REFUSED by the driver (the stream and the cache try to pin those layers again, else repack them into pinned images): ", refused.c_str());
  return buf;
}

std::vector<numa::ExpertEngine::Buffer> host_ranges(const std::vector<cpu::Mat>& mats) {
  const uintptr_t page = 4096;
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  for (const cpu::Mat& m : mats) {
    const size_t data = static_cast<size_t>(m.rows) * m.row_bytes(), groups = static_cast<size_t>(m.rows * m.groups()) * sizeof(float);
    for (const auto& [p, n] : {std::pair<const void*, size_t>{m.data, data}, {m.scales, m.scales ? groups : 0}, {m.zeros, m.zeros ? groups : 0}}) {
      if (!p || !n) continue;
      const auto a = reinterpret_cast<uintptr_t>(p);
      r.push_back({a / page * page, (a + n + page - 1) / page * page});
    }
  }
  std::sort(r.begin(), r.end());
  std::vector<numa::ExpertEngine::Buffer> out;
  uintptr_t lo = 0, hi = 0;
  for (const auto& x : r) {
    if (hi > lo && x.first <= hi) {
      hi = std::max(hi, x.second);
      continue;
    }
    if (hi > lo) out.push_back({reinterpret_cast<const uint8_t*>(lo), hi - lo});
    lo = x.first;
    hi = x.second;
  }
  if (hi > lo) out.push_back({reinterpret_cast<const uint8_t*>(lo), hi - lo});
  return out;
}

bool register_host_buffers(const std::vector<numa::ExpertEngine::Buffer>& buffers, std::vector<gpu::HostRegistration>& out, std::string* why) {
  const size_t first = out.size();
  for (const auto& b : buffers) {
    if (!b.data || !b.bytes) continue;
    gpu::HostRegistration r = gpu::HostRegistration::try_pin(b.data, b.bytes, why);
    if (!r.ok()) {
      out.resize(first);
      return false;
    }
    out.push_back(std::move(r));
  }
  return true;
}

}  // namespace hmoe
