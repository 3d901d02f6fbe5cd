#include "pjrt_flexnpu/base/wire.h"

#include <gtest/gtest.h>

namespace flexnpu::proto {
namespace {

TEST(WireTest, RoundTripsVarintsBytesAndPacked) {
  Writer w;
  w.Varint(1, 300);
  w.Bytes(2, "hello");
  w.PackedVarints(3, {1, 2, 150, -1});
  w.Bool(4, true);
  Reader r(w.str());
  Field f;
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.number, 1u);
  EXPECT_EQ(f.type, WireType::kVarint);
  EXPECT_EQ(f.value, 300u);
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.number, 2u);
  EXPECT_EQ(f.bytes, "hello");
  ASSERT_TRUE(r.Next(&f));
  std::vector<int64_t> values;
  ASSERT_TRUE(AppendVarints(f, &values));
  EXPECT_EQ(values, (std::vector<int64_t>{1, 2, 150, -1}));
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.value, 1u);
  EXPECT_FALSE(r.Next(&f));
  EXPECT_TRUE(r.ok());
}

TEST(WireTest, RawKeepsAFieldVerbatim) {
  Writer w;
  w.Varint(7, 5);
  w.Bytes(9, std::string("\x00\x01\x02", 3));
  Reader r(w.str());
  Writer copy;
  Field f;
  while (r.Next(&f)) copy.Raw(f.raw);
  EXPECT_EQ(copy.str(), w.str());
}

TEST(WireTest, FixedWidthAndGroupsAreSkippable) {
  // field 1 fixed64, field 2 fixed32, field 3 group {field 1 varint 5}, field 4 varint.
  const std::string data("\x09\x01\x00\x00\x00\x00\x00\x00\x00"
                         "\x15\x02\x00\x00\x00"
                         "\x1b\x08\x05\x1c"
                         "\x20\x07",
                         20);
  Reader r(data);
  Field f;
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.value, 1u);
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.value, 2u);
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.type, WireType::kStartGroup);
  ASSERT_TRUE(r.Next(&f));
  EXPECT_EQ(f.number, 4u);
  EXPECT_EQ(f.value, 7u);
  EXPECT_TRUE(r.ok());
}

TEST(WireTest, MalformedInputIsAnErrorNotACrash) {
  const std::vector<std::string> bad = {
      std::string("\x0a\x05hi", 4),                      // length past the end
      std::string("\x08\xff\xff", 3),                    // truncated varint
      std::string("\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12),  // varint too long
      std::string("\x0f", 1),                            // wire type 7
      std::string("\x00\x01", 2),                        // field number 0
      std::string("\x1b\x08\x05", 3),                    // unterminated group
      std::string("\x1b\x24", 2),                        // mismatched end group
      std::string("\x11\x01\x02", 3),                    // truncated fixed64
  };
  for (const auto& data : bad) {
    Reader r(data);
    Field f;
    while (r.Next(&f)) {
    }
    EXPECT_FALSE(r.ok()) << "accepted malformed input of " << data.size() << " bytes";
    EXPECT_FALSE(r.error().empty());
  }
}

TEST(WireTest, PackedVarintsRejectTruncation) {
  Field f;
  f.type = WireType::kLengthDelimited;
  f.bytes = std::string_view("\x01\x80", 2);
  std::vector<int64_t> out;
  EXPECT_FALSE(AppendVarints(f, &out));
}

}  // namespace
}  // namespace flexnpu::proto
