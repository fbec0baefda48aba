// GGUF parsing with a bounds-checked cursor: every read checks the bytes
// left, so a truncated or hostile file ends in an Error, never a crash.
#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "configs/error.h"

namespace hmoe::io {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& msg) {
  fail(ErrorKind::bad_model, path + ": invalid GGUF: " + msg);
}

struct Cursor {
  const std::string& path;
  const uint8_t* p;
  uint64_t size;
  uint64_t pos = 0;

  void need(uint64_t n, const char* what) {
    if (n > size - pos)
      bad(path, std::string("truncated while reading ") + what + " at offset " + std::to_string(pos) + " (needs " +
                    std::to_string(n) + " bytes, " + std::to_string(size - pos) + " left)");
  }
  template <class T> T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string_view str(const char* what) {
    uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string_view s(reinterpret_cast<const char*>(p + pos), n);
    pos += n;
    return s;
  }
};

uint32_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::u8: case GgufType::i8: case GgufType::boolean: return 1;
    case GgufType::u16: case GgufType::i16: return 2;
    case GgufType::u32: case GgufType::i32: case GgufType::f32: return 4;
    case GgufType::u64: case GgufType::i64: case GgufType::f64: return 8;
    default: return 0;
  }
}

bool is_int(GgufType t) { return scalar_size(t) && t != GgufType::f32 && t != GgufType::f64; }
bool is_signed(GgufType t) {
  return t == GgufType::i8 || t == GgufType::i16 || t == GgufType::i32 || t == GgufType::i64;
}

void read_scalar(Cursor& c, GgufType t, GgufValue& v, const char* what) {
  switch (t) {
    case GgufType::u8: v.num.u = c.read<uint8_t>(what); break;
    case GgufType::i8: v.num.i = c.read<int8_t>(what); break;
    case GgufType::boolean: v.num.u = c.read<uint8_t>(what) != 0; break;
    case GgufType::u16: v.num.u = c.read<uint16_t>(what); break;
    case GgufType::i16: v.num.i = c.read<int16_t>(what); break;
    case GgufType::u32: v.num.u = c.read<uint32_t>(what); break;
    case GgufType::i32: v.num.i = c.read<int32_t>(what); break;
    case GgufType::f32: v.num.f = c.read<float>(what); break;
    case GgufType::u64: v.num.u = c.read<uint64_t>(what); break;
    case GgufType::i64: v.num.i = c.read<int64_t>(what); break;
    case GgufType::f64: v.num.f = c.read<double>(what); break;
    default: break;
  }
}

template <class T> T elem_at(const uint8_t* p, GgufType t, uint64_t i) {
  auto ld = [&](auto x) {
    std::memcpy(&x, p + i * sizeof(x), sizeof(x));
    return static_cast<T>(x);
  };
  switch (t) {
    case GgufType::u8: case GgufType::boolean: return ld(uint8_t{});
    case GgufType::i8: return ld(int8_t{});
    case GgufType::u16: return ld(uint16_t{});
    case GgufType::i16: return ld(int16_t{});
    case GgufType::u32: return ld(uint32_t{});
    case GgufType::i32: return ld(int32_t{});
    case GgufType::f32: return ld(float{});
    case GgufType::u64: return ld(uint64_t{});
    case GgufType::i64: return ld(int64_t{});
    case GgufType::f64: return ld(double{});
    default: return T{};
  }
}

[[noreturn]] void wrong_type(std::string_view key, const GgufValue& v, const char* want) {
  fail(ErrorKind::bad_model, "GGUF key '" + std::string(key) + "' is " + gguf_type_name(v.type) + ", expected " + want);
}

constexpr GgmlTypeInfo kGgmlTypes[] = {
    {"f32", 1, 4},        {"f16", 1, 2},        {"q4_0", 32, 18},     {"q4_1", 32, 20},    {nullptr, 0, 0},
    {nullptr, 0, 0},      {"q5_0", 32, 22},     {"q5_1", 32, 24},     {"q8_0", 32, 34},    {"q8_1", 32, 36},
    {"q2_k", 256, 84},    {"q3_k", 256, 110},   {"q4_k", 256, 144},   {"q5_k", 256, 176},  {"q6_k", 256, 210},
    {"q8_k", 256, 292},   {"iq2_xxs", 256, 66}, {"iq2_xs", 256, 74},  {"iq3_xxs", 256, 98}, {"iq1_s", 256, 50},
    {"iq4_nl", 32, 18},   {"iq3_s", 256, 110},  {"iq2_s", 256, 82},   {"iq4_xs", 256, 136}, {"i8", 1, 1},
    {"i16", 1, 2},        {"i32", 1, 4},        {"i64", 1, 8},        {"f64", 1, 8},       {"iq1_m", 256, 56},
    {"bf16", 1, 2},       {nullptr, 0, 0},      {nullptr, 0, 0},      {nullptr, 0, 0},     {"tq1_0", 256, 54},
    {"tq2_0", 256, 66},   {nullptr, 0, 0},      {nullptr, 0, 0},      {nullptr, 0, 0},     {"mxfp4", 32, 17},
};

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "unknown";
}

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  if (type >= sizeof(kGgmlTypes) / sizeof(kGgmlTypes[0]) || !kGgmlTypes[type].name) return nullptr;
  return &kGgmlTypes[type];
}

uint64_t GgufTensor::elements() const {
  uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

uint64_t GgufValue::as_u64(std::string_view key) const {
  if (!is_int(type)) wrong_type(key, *this, "an integer");
  if (is_signed(type) && num.i < 0) fail(ErrorKind::bad_model, "GGUF key '" + std::string(key) + "' is negative");
  return num.u;
}
int64_t GgufValue::as_i64(std::string_view key) const {
  if (!is_int(type)) wrong_type(key, *this, "an integer");
  return num.i;
}
double GgufValue::as_f64(std::string_view key) const {
  if (type == GgufType::f32 || type == GgufType::f64) return num.f;
  if (!is_int(type)) wrong_type(key, *this, "a number");
  return is_signed(type) ? static_cast<double>(num.i) : static_cast<double>(num.u);
}
std::string_view GgufValue::as_string(std::string_view key) const {
  if (type != GgufType::string) wrong_type(key, *this, "a string");
  return str;
}
const std::vector<std::string_view>& GgufValue::as_strings(std::string_view key) const {
  if (type != GgufType::array || elem_type != GgufType::string) wrong_type(key, *this, "an array of strings");
  return strings;
}
template <class T> std::vector<T> GgufValue::as_array(std::string_view key) const {
  if (type != GgufType::array || !scalar_size(elem_type)) wrong_type(key, *this, "an array of numbers");
  std::vector<T> out(count);
  for (uint64_t i = 0; i < count; ++i) out[i] = elem_at<T>(data, elem_type, i);
  return out;
}
template std::vector<int32_t> GgufValue::as_array<int32_t>(std::string_view) const;
template std::vector<int64_t> GgufValue::as_array<int64_t>(std::string_view) const;
template std::vector<uint32_t> GgufValue::as_array<uint32_t>(std::string_view) const;
template std::vector<uint64_t> GgufValue::as_array<uint64_t>(std::string_view) const;
template std::vector<float> GgufValue::as_array<float>(std::string_view) const;
template std::vector<double> GgufValue::as_array<double>(std::string_view) const;

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::io, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(ErrorKind::io, path + ": cannot stat: " + std::strerror(e));
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(ErrorKind::io, path + ": cannot mmap: " + std::strerror(e));
    }
    f->base_ = static_cast<const uint8_t*>(m);
  }
  f->fd_ = fd;
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

bool GgufFile::maps(const void* p, size_t bytes) const {
  const auto* b = static_cast<const uint8_t*>(p);
  return base_ && b >= base_ && bytes <= size_ && static_cast<uint64_t>(b - base_) <= size_ - bytes;
}

void GgufFile::evict(const void* p, size_t bytes) const {
  if (fd_ < 0 || !maps(p, bytes)) return;
  ::posix_fadvise(fd_, static_cast<off_t>(static_cast<const uint8_t*>(p) - base_), static_cast<off_t>(bytes), POSIX_FADV_DONTNEED);
}

void GgufFile::parse() {
  Cursor c{path_, base_, size_};
  c.need(4, "magic");
  if (std::memcmp(base_, "GGUF", 4) != 0) bad(path_, "bad magic (not a GGUF file)");
  c.pos = 4;
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) bad(path_, "unsupported version " + std::to_string(version_) + " (supported: 2, 3)");
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each KV takes >= 12 bytes, each tensor info >= 24: reject counts the file cannot hold.
  if (n_kv > size_ / 12 || n_tensors > size_ / 24)
    bad(path_, "counts (" + std::to_string(n_kv) + " keys, " + std::to_string(n_tensors) + " tensors) exceed the file size");
  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    GgufKv kv;
    kv.key = c.str("metadata key");
    uint64_t at = c.pos;
    auto t = c.read<uint32_t>("metadata type");
    if (t > 12) bad(path_, "key '" + std::string(kv.key) + "' has unknown type " + std::to_string(t) + " at offset " + std::to_string(at));
    GgufValue& v = kv.value;
    v.type = static_cast<GgufType>(t);
    if (v.type == GgufType::string) {
      v.str = c.str("string value");
    } else if (v.type == GgufType::array) {
      auto et = c.read<uint32_t>("array type");
      v.count = c.read<uint64_t>("array count");
      if (et > 12 || et == static_cast<uint32_t>(GgufType::array))
        bad(path_, "key '" + std::string(kv.key) + "' is an array of unsupported type " + std::to_string(et));
      v.elem_type = static_cast<GgufType>(et);
      if (v.elem_type == GgufType::string) {
        if (v.count > (size_ - c.pos) / 8) bad(path_, "key '" + std::string(kv.key) + "': array count " + std::to_string(v.count) + " overruns the file");
        v.strings.reserve(v.count);
        for (uint64_t i = 0; i < v.count; ++i) v.strings.push_back(c.str("array string"));
      } else {
        uint64_t es = scalar_size(v.elem_type);
        if (v.count > (size_ - c.pos) / es) bad(path_, "key '" + std::string(kv.key) + "': array count " + std::to_string(v.count) + " overruns the file");
        v.data = base_ + c.pos;
        c.pos += v.count * es;
      }
    } else {
      read_scalar(c, v.type, v, "scalar value");
    }
    kv_.push_back(std::move(kv));
  }
  if (const GgufValue* a = find("general.alignment")) {
    uint64_t al = a->as_u64("general.alignment");
    if (al == 0 || (al & (al - 1)) != 0) bad(path_, "general.alignment " + std::to_string(al) + " is not a power of two");
    alignment_ = al;
  }
  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    t.name = c.str("tensor name");
    auto nd = c.read<uint32_t>("tensor dims");
    if (nd == 0 || nd > 8) bad(path_, "tensor '" + std::string(t.name) + "' has " + std::to_string(nd) + " dimensions");
    for (uint32_t d = 0; d < nd; ++d) t.shape.push_back(c.read<uint64_t>("tensor shape"));
    t.type = c.read<uint32_t>("tensor type");
    t.offset = c.read<uint64_t>("tensor offset");
    const GgmlTypeInfo* ti = ggml_type_info(t.type);
    if (!ti) bad(path_, "tensor '" + std::string(t.name) + "' has unknown ggml type " + std::to_string(t.type));
    uint64_t n = 1;
    for (auto d : t.shape) {
      if (d != 0 && n > UINT64_MAX / d) bad(path_, "tensor '" + std::string(t.name) + "' shape overflows");
      n *= d;
    }
    if (t.shape[0] % ti->block_elems != 0)
      bad(path_, "tensor '" + std::string(t.name) + "': row of " + std::to_string(t.shape[0]) + " elements is not a multiple of the " +
                     ti->name + " block (" + std::to_string(ti->block_elems) + ")");
    // Checked separately: a shape that fits 64 bits can still need more than 2^64 bytes, and a
    // wrapped size would pass the bounds check below while elements() stays huge.
    if (n / ti->block_elems > UINT64_MAX / ti->block_bytes)
      bad(path_, "tensor '" + std::string(t.name) + "' size in bytes overflows (" + std::to_string(n) + " " + ti->name + " elements)");
    t.bytes = n / ti->block_elems * ti->block_bytes;
    if (t.offset % alignment_ != 0) bad(path_, "tensor '" + std::string(t.name) + "' offset " + std::to_string(t.offset) + " is not aligned to " + std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }
  data_offset_ = (c.pos + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    if (data_offset_ > size_ || t.offset > size_ - data_offset_ || t.bytes > size_ - data_offset_ - t.offset)
      bad(path_, "tensor '" + std::string(t.name) + "' data [" + std::to_string(t.offset) + ", +" + std::to_string(t.bytes) +
                     ") lies beyond the end of the file (data section at " + std::to_string(data_offset_) + ", file " + std::to_string(size_) + " bytes)");
    t.data = base_ + data_offset_ + t.offset;
    if (!tensor_index_.emplace(t.name, &t - tensors_.data()).second) bad(path_, "duplicate tensor name '" + std::string(t.name) + "'");
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& kv : kv_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  if (const GgufValue* v = find(key)) return *v;
  fail(ErrorKind::bad_model, path_ + ": GGUF key '" + std::string(key) + "' is missing");
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace hmoe::io
