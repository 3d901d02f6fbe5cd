// A small protobuf wire-format reader and writer.
//
// FlexNPU rewrites a few fields of XLA protos (compile options) and reads HLO modules without
// linking protobuf: the plugin must not clash with the copies of protobuf that the physical
// backend and jaxlib carry. The reader never trusts a length; the writer can re-emit any field
// verbatim, so unknown fields survive a rewrite.
#ifndef FLEXNPU_BASE_WIRE_H_
#define FLEXNPU_BASE_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flexnpu::proto {

enum class WireType : uint8_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

struct Field {
  uint32_t number = 0;
  WireType type = WireType::kVarint;
  // kVarint, kFixed32 and kFixed64 values (fixed values are stored bit-for-bit).
  uint64_t value = 0;
  // kLengthDelimited payload; for groups the bytes between start and end tag.
  std::string_view bytes;
  // The whole encoded field, tag included: re-emit it to keep a field unchanged.
  std::string_view raw;
};

// Iterates the top-level fields of one message. Next() returns false at the end of the
// message or on malformed input; error() is empty in the first case.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool Next(Field* field);
  const std::string& error() const { return error_; }
  bool ok() const { return error_.empty(); }

 private:
  bool ReadVarint(uint64_t* value);
  bool SkipGroup(uint32_t number);
  bool Fail(const char* what);

  std::string_view data_;
  size_t pos_ = 0;
  std::string error_;
};

// Decodes a packed repeated varint payload (or, with `type` kVarint, one unpacked value)
// and appends to `out`. Returns false on malformed input.
bool AppendVarints(const Field& field, std::vector<int64_t>* out);

// Decodes a packed repeated fixed-width payload; `width` is 4 or 8. Unpacked values of the
// matching wire type are accepted too.
bool AppendFixed(const Field& field, int width, std::vector<uint64_t>* out);

class Writer {
 public:
  void Varint(uint32_t number, uint64_t value);
  void Bool(uint32_t number, bool value) { Varint(number, value ? 1 : 0); }
  void Bytes(uint32_t number, std::string_view bytes);
  void PackedVarints(uint32_t number, const std::vector<int64_t>& values);
  void Raw(std::string_view encoded) { out_.append(encoded); }
  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Tag(uint32_t number, WireType type);
  void RawVarint(uint64_t value);
  std::string out_;
};

}  // namespace flexnpu::proto

#endif  // FLEXNPU_BASE_WIRE_H_
