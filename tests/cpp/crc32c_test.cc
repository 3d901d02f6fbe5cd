#include "pjrt_flexnpu/base/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace flexnpu {
namespace {

// The bit-at-a-time definition, to check the sliced tables against.
uint32_t Reference(std::string_view data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the standard check value
  // RFC 3720 (iSCSI) B.4: 32 bytes of zeros, 32 of 0xff.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

TEST(Crc32cTest, EqualsTheBitwiseDefinitionAtEveryLengthAndOffset) {
  std::string data;
  for (int i = 0; i < 300; ++i) data.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t n = 0; offset + n <= data.size(); n += (n < 40 ? 1 : 37)) {
      const std::string_view piece = std::string_view(data).substr(offset, n);
      EXPECT_EQ(Crc32c(piece), Reference(piece)) << "offset " << offset << " length " << n;
    }
  }
}

TEST(Crc32cTest, ExtendEqualsTheWhole) {
  const std::string data = "the quick brown fox jumps over the lazy dog, twice over";
  for (size_t split = 0; split <= data.size(); ++split) {
    EXPECT_EQ(Crc32cExtend(Crc32c(data.substr(0, split)), data.substr(split)), Crc32c(data));
  }
}

TEST(Crc32cTest, EverySingleBitFlipChangesIt) {
  std::string data(200, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i);
  const uint32_t whole = Crc32c(data);
  for (size_t i = 0; i < data.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = data;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      EXPECT_NE(Crc32c(bad), whole) << "byte " << i << " bit " << bit;
    }
  }
}

}  // namespace
}  // namespace flexnpu
