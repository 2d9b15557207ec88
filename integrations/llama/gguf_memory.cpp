// GGUF v2/v3 metadata: magic, version, tensor count (u64), key/value count (u64), then
// each key (u64 length, bytes), a u32 type and its value; arrays are a u32 element type,
// a u64 count and the elements. Little-endian. Only the key/values are read.
#include "integrations/llama/gguf_memory.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string_view>
#include <vector>

#include "integrations/llama/gguf_format.h"

namespace kvpark::llama {
namespace {

constexpr uint64_t gguf_key_bytes_max = 64 << 10;
constexpr uint64_t gguf_kv_count_max = 1 << 20;
constexpr uint32_t gguf_array_nesting_max = 1;  // llama.cpp writes no arrays of arrays

uint64_t scalar_bytes(uint32_t type) {
  switch (type) {
    case type_u8:
    case type_i8:
    case type_bool:
      return 1;
    case type_u16:
    case type_i16:
      return 2;
    case type_u32:
    case type_i32:
    case type_f32:
      return 4;
    case type_u64:
    case type_i64:
    case type_f64:
      return 8;
    default:
      return 0;
  }
}

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

class Reader {
 public:
  explicit Reader(FILE* f) : f_(f) {}
  template <typename T>
  bool read(T* ret) {
    return std::fread(ret, sizeof *ret, 1, f_) == 1;
  }
  bool skip(uint64_t bytes) {
    return bytes <= INT64_MAX && std::fseek(f_, long(bytes), SEEK_CUR) == 0;
  }
  bool string(std::string* ret) {
    uint64_t n = 0;
    if (!read(&n) || n > gguf_key_bytes_max) return false;
    ret->resize(n);
    return n == 0 || std::fread(ret->data(), 1, n, f_) == n;
  }
  // An integer value of any integer type, as a signed 64-bit number.
  bool integer(uint32_t type, int64_t* ret) {
    switch (type) {
      case type_u8: {
        uint8_t v;
        if (!read(&v)) return false;
        *ret = v;
        return true;
      }
      case type_i8: {
        int8_t v;
        if (!read(&v)) return false;
        *ret = v;
        return true;
      }
      case type_u16: {
        uint16_t v;
        if (!read(&v)) return false;
        *ret = v;
        return true;
      }
      case type_i16: {
        int16_t v;
        if (!read(&v)) return false;
        *ret = v;
        return true;
      }
      case type_u32: {
        uint32_t v;
        if (!read(&v)) return false;
        *ret = v;
        return true;
      }
      case type_i32: {
        int32_t v;
        if (!read(&v)) return false;
        *ret = v;
        return true;
      }
      case type_u64: {
        uint64_t v;
        if (!read(&v)) return false;
        *ret = int64_t(v);
        return true;
      }
      case type_i64: {
        int64_t v;
        if (!read(&v)) return false;
        *ret = v;
        return true;
      }
      default:
        return false;
    }
  }
  bool skip_value(uint32_t type, uint32_t depth = 0) {
    if (type == type_string) {
      uint64_t n = 0;
      return read(&n) && skip(n);
    }
    if (type == type_array) {
      uint32_t element = 0;
      uint64_t count = 0;
      if (depth >= gguf_array_nesting_max || !read(&element) || !read(&count)) return false;
      if (const uint64_t bytes = scalar_bytes(element); bytes > 0)
        return count <= INT64_MAX / bytes && skip(count * bytes);
      for (uint64_t i = 0; i < count; ++i) {
        if (!skip_value(element, depth + 1)) return false;
      }
      return true;
    }
    const uint64_t bytes = scalar_bytes(type);
    return bytes > 0 && skip(bytes);
  }

 private:
  FILE* f_;
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// What the key/values say, before the architecture is known to prefix them.
struct Facts {
  std::string arch;
  std::vector<std::string> sliding_keys;        // keys with a positive sliding window
  std::vector<std::string> recurrent_keys;      // ARCH.ssm.*, ARCH.shortconv.*, ARCH.wkv.*
  std::vector<std::string> attentionless_keys;  // a head_count_kv array holding a 0
};

bool read_facts(Reader& r, Facts* facts) {
  uint32_t magic = 0, version = 0;
  uint64_t tensors = 0, kvs = 0;
  if (!r.read(&magic) || magic != gguf_magic || !r.read(&version) || version < 2 ||
      !r.read(&tensors) || !r.read(&kvs) || kvs > gguf_kv_count_max)
    return false;
  for (uint64_t i = 0; i < kvs; ++i) {
    std::string key;
    uint32_t type = 0;
    if (!r.string(&key) || !r.read(&type) || type >= type_count) return false;
    if (key == "general.architecture" && type == type_string) {
      if (!r.string(&facts->arch)) return false;
    } else if (ends_with(key, ".attention.sliding_window") && scalar_bytes(type) > 0 &&
               type != type_f32 && type != type_f64 && type != type_bool) {
      int64_t window = 0;
      if (!r.integer(type, &window)) return false;
      if (window > 0) facts->sliding_keys.push_back(key);
    } else if (ends_with(key, ".attention.head_count_kv") && type == type_array) {
      uint32_t element = 0;
      uint64_t count = 0;
      if (!r.read(&element) || !r.read(&count) || scalar_bytes(element) == 0) return false;
      bool zero = false;
      for (uint64_t k = 0; k < count; ++k) {
        int64_t heads = 0;
        if (!r.integer(element, &heads)) return false;
        zero = zero || heads == 0;
      }
      if (zero) facts->attentionless_keys.push_back(key);
    } else {
      if (key.find(".ssm.") != std::string::npos || key.find(".shortconv.") != std::string::npos ||
          key.find(".wkv.") != std::string::npos)
        facts->recurrent_keys.push_back(key);
      if (!r.skip_value(type)) return false;
    }
  }
  return !facts->arch.empty();
}

bool any_of_arch(const std::vector<std::string>& keys, const std::string& arch) {
  for (const std::string& k : keys) {
    if (k.rfind(arch + ".", 0) == 0) return true;
  }
  return false;
}

}  // namespace

const char* memory_shape_string(MemoryShape shape) {
  switch (shape) {
    case MemoryShape::kv_cache:
      return "kv_cache";
    case MemoryShape::sliding_window:
      return "sliding_window";
    case MemoryShape::recurrent:
      return "recurrent";
  }
  return "?";
}

GgufReadStatus read_memory_shape(const std::string& path, MemoryShape* ret_shape) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (f == nullptr) return errno == ENOENT ? GgufReadStatus::not_found : GgufReadStatus::io_error;
  Reader reader(f.get());
  Facts facts;
  if (!read_facts(reader, &facts))
    return std::ferror(f.get()) ? GgufReadStatus::io_error : GgufReadStatus::malformed;
  const std::string& a = facts.arch;
  if (any_of_arch(facts.recurrent_keys, a) || any_of_arch(facts.attentionless_keys, a))
    *ret_shape = MemoryShape::recurrent;
  else if (any_of_arch(facts.sliding_keys, a) || a == "gemma2")
    *ret_shape = MemoryShape::sliding_window;
  else
    *ret_shape = MemoryShape::kv_cache;
  return GgufReadStatus::ok;
}

}  // namespace kvpark::llama
