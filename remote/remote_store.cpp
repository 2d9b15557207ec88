// Write, probe, read and delete entries (see remote_store.h).
#include "remote/remote_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

#include "proto/xxh3.h"
#include "remote/remote_limits.h"

namespace kvpark::remote {
namespace {

// The unit of the fused copy-and-checksum of a read (fits in L1 with its source).
constexpr uint64_t copy_piece_bytes = 16 * 1024;

}  // namespace

RemoteStore::RemoteStore(ClusterClient& client, uint32_t chunk_bytes)
    : client_(client), chunk_bytes_(chunk_bytes) {
  assert(chunk_bytes >= chunk_bytes_min && chunk_bytes <= chunk_bytes_max);
}

Status RemoteStore::put(const EntryKey& key, ManifestHeader header, const ImageView& image) {
  const std::string mkey = manifest_key(key);
  std::vector<int32_t> tail;  // a snapshot's tail: its index field's value
  if (key.snapshot) {
    if (image.tokens_bytes % sizeof(int32_t) != 0 ||
        image.tokens_bytes / sizeof(int32_t) > index_tail_tokens_max) {
      return Status::InvalidArgument;
    }
    tail.resize(image.tokens_bytes / sizeof(int32_t));
    if (!tail.empty() && image.copy != nullptr) {
      if (!image.copy(tail.data(), image.tokens, image.tokens_bytes)) return Status::Corrupt;
    } else if (!tail.empty()) {
      std::memcpy(tail.data(), image.tokens, image.tokens_bytes);
    }
    // Pair check with the reader: the tokens are the ones the key names.
    if (tail_digest_of(tail) != key.tail_digest) return Status::Corrupt;
  }
  std::vector<Reply> replies;
  {
    const Command exists{{"EXISTS", mkey}};
    client_.execute({&exists, 1}, replies);
    if (replies[0].status != Status::Ok) return replies[0].status;
    if (replies[0].integer() == 1) {
      if (key.snapshot) {
        if (Status s = index_set(key, tail); s != Status::Ok) return s;
      }
      return Status::AlreadyPresent;
    }
  }
  const uint64_t image_bytes = image.tokens_bytes + image.payload_bytes;
  const uint32_t chunks = chunk_count_for(image_bytes, chunk_bytes_);
  if (chunks > chunks_per_entry_max) return Status::LimitExceeded;
  Manifest manifest;
  manifest.header = header;
  manifest.header.chunk_bytes = chunk_bytes_;
  manifest.header.chunk_count = chunks;
  manifest.header.token_count = static_cast<uint32_t>(image.tokens_bytes / sizeof(int32_t));
  manifest.header.payload_bytes = image.payload_bytes;
  manifest.chunk_checksums.resize(chunks);
  // A chunk that straddles tokens and payload is assembled in a buffer; the rest
  // are sent straight from the caller's memory.
  std::vector<std::string> keys(chunks_in_flight_max);
  std::vector<std::string> joined(chunks_in_flight_max);
  std::vector<Command> batch;
  for (uint32_t first = 0; first < chunks; first += chunks_in_flight_max) {
    const uint32_t n = std::min(chunks_in_flight_max, chunks - first);
    batch.clear();
    for (uint32_t j = 0; j < n; ++j) {
      const uint32_t index = first + j;
      const uint64_t offset = uint64_t{index} * chunk_bytes_;
      const uint64_t bytes = std::min<uint64_t>(chunk_bytes_, image_bytes - offset);
      keys[j] = chunk_key(key, index);
      std::string_view value;
      int runs = 0;
      for_image_range(image.tokens, image.tokens_bytes, image.payload, offset, bytes,
                      [&](const uint8_t* p, uint64_t len) {
                        value = std::string_view(reinterpret_cast<const char*>(p), len);
                        ++runs;
                      });
      if (runs > 1 || image.copy != nullptr) {
        // A chunk straddling tokens and payload, or memory that must be read through
        // `copy`: assembled in a buffer of our own.
        joined[j].resize(bytes);
        uint64_t filled = 0;
        bool copied = true;
        for_image_range(image.tokens, image.tokens_bytes, image.payload, offset, bytes,
                        [&](const uint8_t* p, uint64_t len) {
                          if (image.copy != nullptr) {
                            copied = copied && image.copy(joined[j].data() + filled, p, len);
                          } else {
                            std::memcpy(joined[j].data() + filled, p, len);
                          }
                          filled += len;
                        });
        if (!copied) return Status::Corrupt;
        value = joined[j];
      }
      manifest.chunk_checksums[index] = XXH3_64bits(value.data(), value.size());
      batch.push_back(Command{{"SET", keys[j], value}});
      counters_.bytes_written += value.size();
    }
    client_.execute(batch, replies);
    for (const Reply& r : replies) {
      if (r.status == Status::Ok) continue;
      if (r.status == Status::IoError) ++counters_.writes_refused;
      return r.status;  // no manifest: nobody will read the chunks written so far
    }
  }
  const std::string value = encode_manifest(manifest);
  const Command set{{"SET", mkey, value}};
  client_.execute({&set, 1}, replies);
  if (replies[0].status == Status::IoError) ++counters_.writes_refused;
  if (replies[0].status != Status::Ok) return replies[0].status;
  counters_.bytes_written += value.size();
  // Listed only once whole: a reader that finds the field finds the manifest.
  return key.snapshot ? index_set(key, tail) : Status::Ok;
}

Status RemoteStore::index_set(const EntryKey& key, std::span<const int32_t> tail_tokens) {
  const std::string index = snapshot_index_key(key);
  const std::string field = index_field(key);
  const std::string value = index_value(tail_tokens);
  const Command hset{{"HSET", index, field, value}};
  std::vector<Reply> replies;
  client_.execute({&hset, 1}, replies);
  if (replies[0].status == Status::IoError) ++counters_.writes_refused;
  if (replies[0].status == Status::Ok) counters_.bytes_written += field.size() + value.size();
  return replies[0].status;
}

void RemoteStore::index_clear(const EntryKey& key) {
  const std::string index = snapshot_index_key(key);
  const std::string field = index_field(key);
  const Command hdel{{"HDEL", index, field}};
  std::vector<Reply> replies;
  client_.execute({&hdel, 1}, replies);
}

void RemoteStore::probe(std::span<const EntryKey> keys, std::vector<ProbeResult>& ret_results) {
  ret_results.clear();
  ret_results.resize(keys.size());
  std::vector<std::string> names(keys.size());
  std::vector<Command> batch(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    names[i] = manifest_key(keys[i]);
    batch[i].argv = {"GET", names[i]};
  }
  std::vector<Reply> replies;
  client_.execute(batch, replies);
  for (size_t i = 0; i < keys.size(); ++i) {
    ProbeResult& out = ret_results[i];
    const Reply& r = replies[i];
    if (r.status != Status::Ok) {
      out.status = Status::Unavailable;
      continue;
    }
    if (r.is_nil()) {
      out.status = Status::NotFound;
      // A snapshot is asked for because its index lists it: the store evicted its
      // manifest, so the field names nothing now.
      if (keys[i].snapshot) index_clear(keys[i]);
      continue;
    }
    counters_.bytes_read += r.string().size();
    if (!r.is_string() || decode_manifest(r.string(), out.manifest) != Status::Ok ||
        !manifest_names(out.manifest, keys[i])) {
      // Damaged, truncated or foreign: never served, and deleted so a writer repairs it.
      ++counters_.corrupt_values;
      out.status = Status::Corrupt;
      remove(keys[i], 0);
      continue;
    }
    out.status = Status::Ok;
  }
}

void RemoteStore::probe_index(std::span<const EntryKey> anchors,
                              std::vector<IndexResult>& ret_results) {
  ret_results.clear();
  ret_results.resize(anchors.size());
  std::vector<std::string> names(anchors.size());
  std::vector<Command> batch(anchors.size());
  for (size_t i = 0; i < anchors.size(); ++i) {
    names[i] = snapshot_index_key(anchors[i]);
    batch[i].argv = {"HGETALL", names[i]};
  }
  std::vector<Reply> replies;
  client_.execute(batch, replies);
  std::vector<std::string> bad_fields;  // kept alive for the HDEL batch
  std::vector<size_t> bad_index;
  std::vector<size_t> foreign;
  for (size_t i = 0; i < anchors.size(); ++i) {
    IndexResult& out = ret_results[i];
    const Reply& r = replies[i];
    if (r.status == Status::IoError) {
      // WRONGTYPE: something else lives under the index's key.
      ++counters_.corrupt_values;
      out.status = Status::Corrupt;
      foreign.push_back(i);
      continue;
    }
    if (r.status != Status::Ok) {
      out.status = Status::Unavailable;
      continue;
    }
    const redisReply* array = r.reply.get();
    if (array->type != REDIS_REPLY_ARRAY || array->elements % 2 != 0) {
      ++counters_.corrupt_values;
      out.status = Status::Corrupt;
      foreign.push_back(i);
      continue;
    }
    for (size_t f = 0; f + 1 < array->elements; f += 2) {
      const redisReply* field = array->element[f];
      const redisReply* value = array->element[f + 1];
      if (field->type != REDIS_REPLY_STRING) continue;  // RESP2 hash fields are strings
      counters_.bytes_read += field->len + (value->type == REDIS_REPLY_STRING ? value->len : 0);
      IndexMember m{.key = EntryKey{.ns = anchors[i].ns, .key_hash = anchors[i].key_hash}};
      const std::string_view field_bytes(field->str, field->len);
      if (value->type != REDIS_REPLY_STRING || !decode_index_field(field_bytes, m.key) ||
          !decode_index_value(std::string_view(value->str, value->len), m.key, m.tail_tokens)) {
        ++counters_.corrupt_values;  // never offered, and cleared
        bad_fields.emplace_back(field_bytes);
        bad_index.push_back(i);
        continue;
      }
      if (out.members.size() < index_fields_max) out.members.push_back(std::move(m));
    }
    out.status = out.members.empty() ? Status::NotFound : Status::Ok;
  }
  std::vector<Command> cleanup;
  for (size_t k = 0; k < bad_fields.size(); ++k) {
    cleanup.push_back(Command{{"HDEL", names[bad_index[k]], bad_fields[k]}});
  }
  for (size_t i : foreign) cleanup.push_back(Command{{"DEL", names[i]}});
  if (!cleanup.empty()) client_.execute(cleanup, replies);
}

bool batchable(const Manifest& manifest) {
  return manifest.header.chunk_count == 1 && manifest.image_bytes() <= batched_get_entry_bytes_max;
}

Status RemoteStore::take_chunk(const Reply& r, const Manifest& manifest, const ImageTarget& target,
                               uint32_t index) {
  const ManifestHeader& h = manifest.header;
  if (r.status != Status::Ok) return Status::Unavailable;
  if (r.is_nil()) return Status::NotFound;  // evicted by the store: the entry is incomplete
  const std::string_view value = r.string();
  counters_.bytes_read += value.size();
  const uint64_t image_bytes = manifest.image_bytes();
  const uint64_t offset = uint64_t{index} * h.chunk_bytes;
  const uint64_t bytes = std::min<uint64_t>(h.chunk_bytes, image_bytes - offset);
  if (!r.is_string() || value.size() != bytes) return Status::Corrupt;
  // Copy and checksum fused: each piece is hashed right after it is copied, while the
  // source is still in cache (one pass over the value, not two).
  XXH3_state_t sum;
  XXH3_64bits_reset(&sum);
  uint64_t consumed = 0;
  bool copied = true;
  for_image_range(target.tokens, target.tokens_bytes, target.payload, offset, bytes,
                  [&](uint8_t* p, uint64_t len) {
                    for (uint64_t done = 0; done < len && copied; done += copy_piece_bytes) {
                      const uint64_t piece = std::min<uint64_t>(copy_piece_bytes, len - done);
                      const char* src = value.data() + consumed + done;
                      if (target.copy != nullptr) {
                        copied = target.copy(p + done, src, piece);
                      } else {
                        std::memcpy(p + done, src, piece);
                      }
                      XXH3_64bits_update(&sum, src, piece);
                    }
                    consumed += len;
                  });
  if (!copied) return Status::IoError;  // the destination failed, not the store
  // What was copied is never sealed on a mismatch: the entry is erased.
  return XXH3_64bits_digest(&sum) == manifest.chunk_checksums[index] ? Status::Ok : Status::Corrupt;
}

namespace {

bool target_fits(const Manifest& manifest, const ImageTarget& target) {
  const ManifestHeader& h = manifest.header;
  return target.tokens_bytes == uint64_t{h.token_count} * sizeof(int32_t) &&
         target.payload_bytes == h.payload_bytes;
}

}  // namespace

Status RemoteStore::get(const EntryKey& key, const Manifest& manifest, const ImageTarget& target) {
  const ManifestHeader& h = manifest.header;
  if (!target_fits(manifest, target)) return Status::InvalidArgument;
  std::vector<std::string> keys(chunks_in_flight_max);
  std::vector<Command> batch;
  std::vector<Reply> replies;
  Status result = Status::Ok;
  for (uint32_t first = 0; first < h.chunk_count && result == Status::Ok;
       first += chunks_in_flight_max) {
    const uint32_t n = std::min(chunks_in_flight_max, h.chunk_count - first);
    batch.clear();
    for (uint32_t j = 0; j < n; ++j) {
      keys[j] = chunk_key(key, first + j);
      batch.push_back(Command{{"GET", keys[j]}});
    }
    client_.execute(batch, replies);
    for (uint32_t j = 0; j < n && result == Status::Ok; ++j) {
      result = take_chunk(replies[j], manifest, target, first + j);
    }
  }
  if (result == Status::Corrupt || result == Status::NotFound) {
    if (result == Status::Corrupt) ++counters_.corrupt_values;
    remove(key, h.chunk_count);  // incomplete or damaged: nobody should find it again
  }
  return result;
}

void RemoteStore::get_batch(std::span<const GetRequest> requests, std::vector<Status>& ret_statuses) {
  assert(requests.size() <= batched_gets_max);
  ret_statuses.assign(requests.size(), Status::InvalidArgument);
  std::vector<std::string> keys(requests.size());
  std::vector<Command> batch;
  std::vector<size_t> asked;  // request of each command
  for (size_t i = 0; i < requests.size(); ++i) {
    const GetRequest& g = requests[i];
    assert(batchable(*g.manifest));
    if (!target_fits(*g.manifest, g.target)) continue;
    keys[i] = chunk_key(g.key, 0);
    batch.push_back(Command{{"GET", keys[i]}});
    asked.push_back(i);
  }
  std::vector<Reply> replies;
  if (!batch.empty()) client_.execute(batch, replies);
  for (size_t k = 0; k < asked.size(); ++k) {
    const GetRequest& g = requests[asked[k]];
    const Status result = take_chunk(replies[k], *g.manifest, g.target, 0);
    ret_statuses[asked[k]] = result;
    if (result == Status::Corrupt || result == Status::NotFound) {
      if (result == Status::Corrupt) ++counters_.corrupt_values;
      remove(g.key, g.manifest->header.chunk_count);
    }
  }
}

void RemoteStore::remove(const EntryKey& key, uint32_t chunk_count) {
  std::vector<std::string> names;
  names.push_back(manifest_key(key));
  for (uint32_t i = 0; i < chunk_count; ++i) names.push_back(chunk_key(key, i));
  std::vector<Command> batch;
  for (const std::string& n : names) batch.push_back(Command{{"DEL", n}});
  std::string index, field;
  if (key.snapshot) {
    index = snapshot_index_key(key);
    field = index_field(key);
    batch.push_back(Command{{"HDEL", index, field}});
  }
  std::vector<Reply> replies;
  client_.execute(batch, replies);
}

}  // namespace kvpark::remote
