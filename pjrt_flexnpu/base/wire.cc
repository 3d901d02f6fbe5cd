#include "pjrt_flexnpu/base/wire.h"

namespace flexnpu::proto {
namespace {
constexpr int kMaxGroupDepth = 64;
}  // namespace

bool Reader::Fail(const char* what) {
  error_ = std::string(what) + " at byte " + std::to_string(pos_);
  return false;
}

bool Reader::ReadVarint(uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos_ >= data_.size()) return Fail("truncated varint");
    const uint8_t byte = static_cast<uint8_t>(data_[pos_++]);
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *value = result;
      return true;
    }
  }
  return Fail("varint longer than 10 bytes");
}

bool Reader::SkipGroup(uint32_t number) {
  // Groups are deprecated but legal: skip nested fields until the matching end tag.
  std::vector<uint32_t> open{number};
  while (!open.empty()) {
    if (open.size() > kMaxGroupDepth) return Fail("groups nested too deeply");
    uint64_t tag;
    if (!ReadVarint(&tag)) return false;
    const auto type = static_cast<WireType>(tag & 7);
    const auto field_number = static_cast<uint32_t>(tag >> 3);
    uint64_t scratch;
    switch (type) {
      case WireType::kVarint:
        if (!ReadVarint(&scratch)) return false;
        break;
      case WireType::kFixed64:
        if (data_.size() - pos_ < 8) return Fail("truncated fixed64");
        pos_ += 8;
        break;
      case WireType::kFixed32:
        if (data_.size() - pos_ < 4) return Fail("truncated fixed32");
        pos_ += 4;
        break;
      case WireType::kLengthDelimited:
        if (!ReadVarint(&scratch)) return false;
        if (scratch > data_.size() - pos_) return Fail("length past end of message");
        pos_ += scratch;
        break;
      case WireType::kStartGroup:
        open.push_back(field_number);
        break;
      case WireType::kEndGroup:
        if (field_number != open.back()) return Fail("mismatched end group");
        open.pop_back();
        break;
      default:
        return Fail("invalid wire type");
    }
  }
  return true;
}

bool Reader::Next(Field* field) {
  if (!error_.empty() || pos_ >= data_.size()) return false;
  const size_t start = pos_;
  uint64_t tag;
  if (!ReadVarint(&tag)) return false;
  const uint64_t number = tag >> 3;
  if (number == 0 || number > 0x1fffffff) return Fail("invalid field number");
  field->number = static_cast<uint32_t>(number);
  field->type = static_cast<WireType>(tag & 7);
  field->value = 0;
  field->bytes = {};
  switch (field->type) {
    case WireType::kVarint:
      if (!ReadVarint(&field->value)) return false;
      break;
    case WireType::kFixed64:
    case WireType::kFixed32: {
      const size_t width = field->type == WireType::kFixed64 ? 8 : 4;
      if (data_.size() - pos_ < width) return Fail("truncated fixed-width field");
      uint64_t v = 0;
      for (size_t i = 0; i < width; ++i) {
        v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
      }
      field->value = v;
      pos_ += width;
      break;
    }
    case WireType::kLengthDelimited: {
      uint64_t length;
      if (!ReadVarint(&length)) return false;
      if (length > data_.size() - pos_) return Fail("length past end of message");
      field->bytes = data_.substr(pos_, length);
      pos_ += length;
      break;
    }
    case WireType::kStartGroup: {
      const size_t body = pos_;
      if (!SkipGroup(field->number)) return false;
      field->bytes = data_.substr(body, pos_ - body);
      break;
    }
    default:
      return Fail("invalid wire type");
  }
  field->raw = data_.substr(start, pos_ - start);
  return true;
}

bool AppendVarints(const Field& field, std::vector<int64_t>* out) {
  if (field.type == WireType::kVarint) {
    out->push_back(static_cast<int64_t>(field.value));
    return true;
  }
  if (field.type != WireType::kLengthDelimited) return false;
  const std::string_view data = field.bytes;
  size_t pos = 0;
  while (pos < data.size()) {
    uint64_t result = 0;
    bool done = false;
    for (int shift = 0; shift < 64 && pos < data.size(); shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(data[pos++]);
      result |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        done = true;
        break;
      }
    }
    if (!done) return false;
    out->push_back(static_cast<int64_t>(result));
  }
  return true;
}

bool AppendFixed(const Field& field, int width, std::vector<uint64_t>* out) {
  const WireType unpacked = width == 8 ? WireType::kFixed64 : WireType::kFixed32;
  if (field.type == unpacked) {
    out->push_back(field.value);
    return true;
  }
  if (field.type != WireType::kLengthDelimited || (width != 4 && width != 8)) return false;
  if (field.bytes.size() % width != 0) return false;
  for (size_t pos = 0; pos < field.bytes.size(); pos += width) {
    uint64_t v = 0;
    for (int i = 0; i < width; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(field.bytes[pos + i])) << (8 * i);
    }
    out->push_back(v);
  }
  return true;
}

void Writer::RawVarint(uint64_t value) {
  while (value >= 0x80) {
    out_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out_.push_back(static_cast<char>(value));
}

void Writer::Tag(uint32_t number, WireType type) {
  RawVarint((static_cast<uint64_t>(number) << 3) | static_cast<uint64_t>(type));
}

void Writer::Varint(uint32_t number, uint64_t value) {
  Tag(number, WireType::kVarint);
  RawVarint(value);
}

void Writer::Bytes(uint32_t number, std::string_view bytes) {
  Tag(number, WireType::kLengthDelimited);
  RawVarint(bytes.size());
  out_.append(bytes);
}

void Writer::PackedVarints(uint32_t number, const std::vector<int64_t>& values) {
  Writer payload;
  for (int64_t v : values) payload.RawVarint(static_cast<uint64_t>(v));
  Bytes(number, payload.str());
}

}  // namespace flexnpu::proto
