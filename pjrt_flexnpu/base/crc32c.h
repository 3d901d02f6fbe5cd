// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4 metadata
// and LevelDB/RocksDB blocks. FlexNPU uses it to tell corrupt bytes (a flipped bit, a cut or
// extended file) from intact ones before parsing them. It detects every single-bit error and
// every burst of up to 32 bits; other random damage passes with probability 2^-32. It is no
// defence against a deliberately crafted input.
//
// Portable table-driven code (slicing by 8, about a byte per cycle): no dependency, the same
// result on every machine.
#ifndef FLEXNPU_BASE_CRC32C_H_
#define FLEXNPU_BASE_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace flexnpu {

// Extends `crc`, the Crc32c of earlier bytes, over `data`:
// Crc32cExtend(Crc32c(a), b) == Crc32c(a + b), so disjoint pieces need no copy.
uint32_t Crc32cExtend(uint32_t crc, std::string_view data);

inline uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_CRC32C_H_
