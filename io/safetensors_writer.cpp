#include "io/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "configs/error.h"

namespace hmoe::io {

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  uint64_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string header = h.dump();
  while ((header.size() + 8) % 8) header.push_back(' ');
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail(ErrorKind::io, tmp + ": cannot create: " + std::strerror(errno));
  uint64_t hl = header.size();
  bool ok = std::fwrite(&hl, 8, 1, f) == 1 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const auto& t : tensors) ok = ok && (t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size());
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(ErrorKind::io, path + ": write failed: " + std::strerror(errno));
  }
}

}  // namespace hmoe::io
