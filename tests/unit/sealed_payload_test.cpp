// proto/sealed_payload.h: the one header kvpark_llama and kvpark-proxy put in front
// of the engine state they park.
#include "proto/sealed_payload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "integrations/llama/snapshot_format.h"
#include "proxy/slot_file.h"

namespace kvpark {
namespace {

constexpr uint64_t magic = proxy::slot_file_magic;

std::vector<uint8_t> sealed(uint32_t position, size_t body_bytes, uint64_t with_magic = magic) {
  std::vector<uint8_t> payload(sizeof(SealedPayloadHeader) + body_bytes);
  uint8_t next = 0;
  std::generate(payload.begin() + sizeof(SealedPayloadHeader), payload.end(),
                [&next] { return next += 7; });
  sealed_payload_seal(payload.data(), with_magic, position, body_bytes);
  return payload;
}

TEST(SealedPayload, SealedPayloadPassesItsCheck) {
  for (size_t body_bytes : {size_t{0}, size_t{1}, size_t{4096}, size_t{1001}}) {
    const auto p = sealed(1234, body_bytes);
    EXPECT_EQ(sealed_payload_check(p.data(), p.size(), magic, 1234), SealedPayloadCheck::ok)
        << body_bytes;
  }
}

TEST(SealedPayload, HeaderLayoutIsVersionOneInThirtyTwoBytes) {
  // The layout both producers have written since their first release: a change
  // here makes every parked payload unreadable, so it must bump format_version.
  EXPECT_EQ(SealedPayloadHeader::format_version, 1u);
  EXPECT_EQ(offsetof(SealedPayloadHeader, magic), 0u);
  EXPECT_EQ(offsetof(SealedPayloadHeader, version), 8u);
  EXPECT_EQ(offsetof(SealedPayloadHeader, position_tokens), 12u);
  EXPECT_EQ(offsetof(SealedPayloadHeader, body_bytes), 16u);
  EXPECT_EQ(offsetof(SealedPayloadHeader, body_xxh3_64), 24u);
  const auto p = sealed(77, 10);
  SealedPayloadHeader h;
  ASSERT_EQ(sealed_payload_check_header(p.data(), p.size(), magic, 77, &h), SealedPayloadCheck::ok);
  EXPECT_EQ(h.magic, magic);
  EXPECT_EQ(h.version, 1u);
  EXPECT_EQ(h.position_tokens, 77u);
  EXPECT_EQ(h.body_bytes, 10u);
}

TEST(SealedPayload, RefusesEveryDamage) {
  const auto good = sealed(1234, 4096);
  auto flipped = good;
  flipped.back() ^= 0x10;
  EXPECT_EQ(sealed_payload_check(flipped.data(), flipped.size(), magic, 1234),
            SealedPayloadCheck::bad_checksum);
  EXPECT_EQ(sealed_payload_check(good.data(), good.size() - 1, magic, 1234),
            SealedPayloadCheck::wrong_size);
  EXPECT_EQ(sealed_payload_check(good.data(), good.size(), magic, 1233),
            SealedPayloadCheck::wrong_position);
  EXPECT_EQ(sealed_payload_check(good.data(), sizeof(SealedPayloadHeader), magic, 1234),
            SealedPayloadCheck::wrong_size) << "a header alone: N";
  EXPECT_EQ(sealed_payload_check(good.data(), sizeof(SealedPayloadHeader) - 1, magic, 1234),
            SealedPayloadCheck::short_payload) << "N-1";
  EXPECT_EQ(sealed_payload_check(nullptr, good.size(), magic, 1234),
            SealedPayloadCheck::short_payload);
  auto bad_magic = good;
  bad_magic[0] ^= 1;
  EXPECT_EQ(sealed_payload_check(bad_magic.data(), bad_magic.size(), magic, 1234),
            SealedPayloadCheck::bad_magic);
  auto version = good;
  version[offsetof(SealedPayloadHeader, version)] += 1;
  EXPECT_EQ(sealed_payload_check(version.data(), version.size(), magic, 1234),
            SealedPayloadCheck::bad_version);
}

TEST(SealedPayload, HeaderCheckLeavesTheBodyToTheCaller) {
  auto flipped = sealed(1234, 4096);
  flipped.back() ^= 0x10;
  SealedPayloadHeader h{};
  EXPECT_EQ(sealed_payload_check_header(flipped.data(), flipped.size(), magic, 1234, &h),
            SealedPayloadCheck::ok);
  EXPECT_EQ(h.body_bytes, 4096u);
  SealedPayloadHeader untouched{.magic = 9};
  EXPECT_EQ(sealed_payload_check_header(flipped.data(), flipped.size(), magic, 1, &untouched),
            SealedPayloadCheck::wrong_position);
  EXPECT_EQ(untouched.magic, 9u) << "ret_header is untouched on failure";
}

// Each producer's magic: a slot file is never handed to llama.cpp, nor llama.cpp
// state to llama-server.
TEST(SealedPayload, OneProducersPayloadIsRefusedByTheOther) {
  EXPECT_NE(llama::snapshot_magic, proxy::slot_file_magic);
  const auto from_llama = sealed(100, 1001, llama::snapshot_magic);
  EXPECT_EQ(sealed_payload_check(from_llama.data(), from_llama.size(), llama::snapshot_magic, 100),
            SealedPayloadCheck::ok);
  EXPECT_EQ(sealed_payload_check(from_llama.data(), from_llama.size(), proxy::slot_file_magic, 100),
            SealedPayloadCheck::bad_magic);
  const auto from_proxy = sealed(100, 1001, proxy::slot_file_magic);
  EXPECT_EQ(sealed_payload_check(from_proxy.data(), from_proxy.size(), llama::snapshot_magic, 100),
            SealedPayloadCheck::bad_magic);
}

TEST(SealedPayload, EveryCheckHasItsOwnReason) {
  EXPECT_STREQ(sealed_payload_check_string(SealedPayloadCheck::bad_checksum), "checksum mismatch");
  EXPECT_STREQ(sealed_payload_check_string(SealedPayloadCheck::ok), "ok");
  EXPECT_STRNE(sealed_payload_check_string(SealedPayloadCheck::wrong_size),
               sealed_payload_check_string(SealedPayloadCheck::wrong_position));
}

}  // namespace
}  // namespace kvpark
