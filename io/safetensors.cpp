#include "io/safetensors.h"

#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "configs/error.h"

namespace hmoe::io {

namespace {
constexpr uint64_t kMaxHeader = 100ull << 20;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  fail(ErrorKind::bad_model, path + ": " + what);
}
}  // namespace

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) {
  file_ = std::make_unique<MappedFile>(path);
  const uint8_t* base = file_->data();
  const size_t size = file_->size();
  if (size < 8) bad(path, "truncated safetensors file (" + std::to_string(size) + " bytes, no header length)");
  uint64_t hlen;
  std::memcpy(&hlen, base, 8);
  if (hlen > kMaxHeader) bad(path, "safetensors header length " + std::to_string(hlen) + " is larger than the 100 MiB limit (corrupt file?)");
  if (hlen > size - 8) bad(path, "safetensors header length " + std::to_string(hlen) + " runs past the end of the file (" + std::to_string(size) + " bytes): truncated or corrupt");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(base + 8, base + 8 + hlen);
  } catch (const std::exception& e) {
    bad(path, std::string("safetensors header is not valid JSON: ") + e.what());
  }
  if (!h.is_object()) bad(path, "safetensors header is not a JSON object");
  const uint8_t* data = base + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::vector<std::string> range_names;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (it->is_object())
        for (auto m = it->begin(); m != it->end(); ++m)
          if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
      continue;
    }
    const auto& t = *it;
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      bad(path, "tensor '" + name + "': header entry needs dtype, shape and data_offsets");
    if (!t["dtype"].is_string()) bad(path, "tensor '" + name + "': dtype is not a string");
    TensorView v;
    v.name = name;
    if (!dtype_from_name(t["dtype"].get<std::string>(), v.dtype))
      bad(path, "tensor '" + name + "': unknown dtype '" + t["dtype"].get<std::string>() + "'");
    if (!t["shape"].is_array()) bad(path, "tensor '" + name + "': shape is not an array");
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned()) bad(path, "tensor '" + name + "': shape has a non-integer or negative entry");
      uint64_t x = d.get<uint64_t>();
      if (x > (1ull << 40) || (x && numel > (1ull << 48) / x)) bad(path, "tensor '" + name + "': shape is absurdly large");
      numel *= x;
      v.shape.push_back(static_cast<int64_t>(x));
    }
    const auto& off = t["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(path, "tensor '" + name + "': data_offsets must be two non-negative integers");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) bad(path, "tensor '" + name + "': data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
    if (e > data_size)
      bad(path, "tensor '" + name + "': data_offsets end " + std::to_string(e) + " is past the end of the data (" +
                    std::to_string(data_size) + " bytes): truncated shard?");
    if (e - b != numel * dtype_size(v.dtype))
      bad(path, "tensor '" + name + "': " + std::to_string(e - b) + " bytes for shape " + v.shape_str() + " of " +
                    dtype_name(v.dtype) + " (expected " + std::to_string(numel * dtype_size(v.dtype)) + ")");
    v.data = data + b;
    v.nbytes = e - b;
    v.file = &file_->path();
    ranges.emplace_back(b, e);
    range_names.push_back(name);
    tensors_.emplace(name, std::move(v));
  }
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& p = ranges[order[i - 1]];
    const auto& c = ranges[order[i]];
    if (c.first < p.second && c.first != c.second && p.first != p.second)
      bad(path, "tensors '" + range_names[order[i - 1]] + "' and '" + range_names[order[i]] + "' overlap in the data section");
  }
}

TensorStore::TensorStore(const std::string& dir) : dir_(dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;
  if (file_exists(index_path)) {
    nlohmann::json idx;
    try {
      idx = nlohmann::json::parse(read_text_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::bad_model, index_path + ": not valid JSON: " + e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
      fail(ErrorKind::bad_model, index_path + ": has no 'weight_map' object");
    std::set<std::string> seen;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string()) fail(ErrorKind::bad_model, index_path + ": weight_map entry '" + it.key() + "' is not a file name");
      std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        fail(ErrorKind::bad_model, index_path + ": shard name '" + shard + "' must be a plain file name");
      weight_map[it.key()] = shard;
      if (seen.insert(shard).second) shard_names.push_back(shard);
    }
    for (const auto& s : shard_names)
      if (!file_exists(dir + "/" + s))
        fail(ErrorKind::bad_model, index_path + " names shard '" + s + "', which does not exist in " + dir);
  } else if (file_exists(dir + "/model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    DIR* d = ::opendir(dir.c_str());
    if (!d) fail(ErrorKind::io, dir + ": cannot open model directory");
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") shard_names.push_back(n);
    }
    ::closedir(d);
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) fail(ErrorKind::bad_model, dir + ": no model.safetensors.index.json and no .safetensors files");
  }
  for (const auto& s : shard_names) files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + s));
  for (const auto& f : files_)
    for (const auto& [name, view] : f->tensors()) {
      if (!weight_map.empty()) {
        auto w = weight_map.find(name);
        if (w == weight_map.end() || dir + "/" + w->second != f->file().path()) continue;  // index decides
      }
      if (index_.count(name)) fail(ErrorKind::bad_model, f->file().path() + ": tensor '" + name + "' appears in two shards");
      index_[name] = &view;
    }
  for (const auto& [name, shard] : weight_map)
    if (!index_.count(name))
      fail(ErrorKind::bad_model, index_path + ": tensor '" + name + "' is mapped to '" + shard + "', which does not contain it");
}

const TensorView* TensorStore::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& TensorStore::get(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorView* v = find(name);
  if (!v) fail(ErrorKind::bad_model, dir_ + ": missing tensor '" + name + "'");
  if (!shape.empty() && v->shape != shape) {
    TensorView want;
    want.shape = shape;
    fail(ErrorKind::bad_model, *v->file + ": tensor '" + name + "' has shape " + v->shape_str() + ", expected " + want.shape_str());
  }
  return *v;
}

bool TensorStore::maps(const void* p, size_t bytes) const {
  const auto* b = static_cast<const uint8_t*>(p);
  for (const auto& f : files_) {
    const uint8_t* d = f->file().data();
    if (d && b >= d && bytes <= f->file().size() && static_cast<size_t>(b - d) <= f->file().size() - bytes) return true;
  }
  return false;
}

size_t TensorStore::total_bytes() const {
  size_t n = 0;
  for (const auto& [k, v] : index_) n += v->nbytes;
  return n;
}

}  // namespace hmoe::io
