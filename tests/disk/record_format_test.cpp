// Pure format tests: header checks, layout, ids. No files.
#include <gtest/gtest.h>

#include <vector>

#include "iouring/record_format.h"
#include "tests/disk/disk_testing.h"

using namespace kvpark;
using namespace kvpark::disk;
using kvpark::disk::testing::make_meta;

namespace {
RecordHeader sealed(uint64_t image_bytes, std::vector<uint64_t>& table) {
  RecordHeader h = prepare_record_header(make_meta(1, image_bytes), 1 << 20);
  table.assign(h.chunk_count, 0);
  for (uint32_t i = 0; i < h.chunk_count; ++i) table[i] = 1000 + i;
  seal_record_header(h, table.data());
  return h;
}
}  // namespace

TEST(RecordFormat, SealedHeaderVerifies) {
  std::vector<uint64_t> table;
  RecordHeader h = sealed(3 * (1 << 20) + 4096, table);
  EXPECT_EQ(h.magic, record_magic);
  EXPECT_EQ(h.format_version, record_format_version);
  EXPECT_EQ(h.chunk_count, 4u);
  uint64_t file_bytes = record_layout(h.image_bytes, h.checksum_chunk_bytes).file_bytes;
  EXPECT_EQ(check_record_header(h, file_bytes), HeaderDefect::None);
  check_record_for_write(h, table.data());
}

TEST(RecordFormat, DetectsEachHeaderDefect) {
  std::vector<uint64_t> table;
  RecordHeader good = sealed(1 << 20, table);
  uint64_t file_bytes = record_layout(good.image_bytes, good.checksum_chunk_bytes).file_bytes;

  RecordHeader h = good;
  h.magic = 0;
  EXPECT_EQ(check_record_header(h, file_bytes), HeaderDefect::BadMagic);
  RecordHeader zero{};
  EXPECT_EQ(check_record_header(zero, file_bytes), HeaderDefect::BadMagic);
  h = good;
  h.format_version = record_format_version + 1;
  EXPECT_EQ(check_record_header(h, file_bytes), HeaderDefect::OtherVersion);
  // Every single-bit flip outside magic/version is caught by the header checksum.
  for (size_t byte = 8; byte < sizeof(RecordHeader); ++byte) {
    h = good;
    reinterpret_cast<uint8_t*>(&h)[byte] ^= 0x10;
    EXPECT_NE(check_record_header(h, file_bytes), HeaderDefect::None) << "byte " << byte;
  }
  EXPECT_EQ(check_record_header(good, file_bytes - 4096), HeaderDefect::SizeMismatch);
  EXPECT_EQ(check_record_header(good, file_bytes + 4096), HeaderDefect::SizeMismatch);
  // Consistent checksum over inconsistent fields is still refused.
  h = good;
  h.chunk_count += 1;
  h.header_checksum = record_header_checksum(h);
  EXPECT_EQ(check_record_header(h, file_bytes), HeaderDefect::BadFields);
}

TEST(RecordFormat, LayoutPadsEveryRegionTo4KiB) {
  RecordLayout l = record_layout(1, 1 << 20);
  EXPECT_EQ(l.table_offset, 4096u);
  EXPECT_EQ(l.table_bytes, 4096u);
  EXPECT_EQ(l.image_offset, 8192u);
  EXPECT_EQ(l.file_bytes, 12288u);
  // 513 chunks need 4104 table bytes: two pages.
  l = record_layout(512ull * (1 << 20) + 1, 1 << 20);
  EXPECT_EQ(l.table_bytes, 8192u);
  EXPECT_EQ(l.file_bytes, 4096u + 8192u + align_io(512ull * (1 << 20) + 1));
  EXPECT_EQ(record_chunk_count(1 << 20, 1 << 20), 1u);
  EXPECT_EQ(record_chunk_count((1 << 20) + 1, 1 << 20), 2u);
}

TEST(RecordFormat, IdIsKeyedOnNamespaceKindKeyAndTail) {
  RecordHeader a = make_meta(7, 4096);
  RecordHeader b = a;
  b.hits = 99;  // not part of the key
  EXPECT_EQ(record_id_for(a), record_id_for(b));
  b = a;
  b.namespace_id.low ^= 1;
  EXPECT_NE(record_id_for(a), record_id_for(b));
  b = a;
  b.kind = static_cast<uint8_t>(EntryKind::Snapshot);
  b.tail_digest = Hash128{1, 2};
  EXPECT_NE(record_id_for(a), record_id_for(b));
}

TEST(RecordFormat, IdHexRoundTripsAndNamesItsFanoutDir) {
  RecordId id = record_id_for(make_meta(3, 4096));
  std::string hex = record_id_hex(id);
  ASSERT_EQ(hex.size(), 32u);
  RecordId back;
  ASSERT_TRUE(parse_record_id_hex(hex, back));
  EXPECT_EQ(back, id);
  EXPECT_EQ(std::stoul(hex.substr(0, 2), nullptr, 16), record_fanout_dir(id));
  EXPECT_FALSE(parse_record_id_hex(hex.substr(1), back));
  EXPECT_FALSE(parse_record_id_hex("G" + hex.substr(1), back));
}

TEST(RecordFormat, RejectsInvalidMeta) {
  RecordHeader m = make_meta(1, 4096);
  EXPECT_TRUE(record_meta_valid(m));
  m.image_bytes = 0;
  EXPECT_FALSE(record_meta_valid(m));
  m = make_meta(1, 4096);
  m.payload_bytes = 4097;
  EXPECT_FALSE(record_meta_valid(m));
  m = make_meta(1, 4096);
  m.tail_digest = Hash128{1, 0};  // blocks carry no tail
  EXPECT_FALSE(record_meta_valid(m));
  m = make_meta(1, 4096);
  m.evidence = evidence_max + 1;
  EXPECT_FALSE(record_meta_valid(m));
  m = make_meta(1, record_image_bytes_max + 1);
  EXPECT_FALSE(record_meta_valid(m));
}
