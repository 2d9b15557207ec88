// Redis Cluster key -> hash slot: CRC16 (XMODEM) of the key, or of its hash tag
// (the part between the first '{' and the next '}', when non-empty), mod 16384.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvpark::remote {

uint16_t crc16_xmodem(std::string_view bytes);
uint16_t key_slot(std::string_view key);

}  // namespace kvpark::remote
