// Entries in a Redis-protocol store: write, existence check, streamed read, delete
// (the record layout is record_layout.h; routing and pipelining cluster_client.h).
//
// Synchronous, one thread: the daemon's remote worker calls these. Writes put every
// chunk (pipelined, chunks_in_flight_max at a time) and then the manifest, so a
// reader never sees half an entry; an entry whose manifest is already there is not
// written again (content-addressed and immutable: whoever wrote it wrote the same).
// Reads check every chunk's XXH3-64 before copying it into the caller's memory (the
// payload's own checksum, kept in the manifest, is the reader's to check: libkvpark
// verifies it while an engine copies out, so it is not hashed a second time here); a value that is missing, truncated, fails a check or names
// another entry is a miss (Corrupt or NotFound), and a corrupt entry's keys are
// deleted so the next writer repairs it. A store that cannot be reached answers
// Unavailable; one that refuses a write (out of memory) answers IoError.
//
// Snapshots are also listed in their anchor's index (record_layout.h): put() sets
// the snapshot's field after its manifest (and again when the manifest was already
// there: a field the store evicted comes back with the next writer), remove()
// clears it, a probe that finds a field's manifest gone (evicted) clears the field,
// and probe_index() reads an anchor's fields, clearing any that fail to decode.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "remote/cluster_client.h"
#include "remote/record_layout.h"

namespace kvpark::remote {

struct StoreCounters {
  uint64_t bytes_written = 0;  // chunk and manifest values sent
  uint64_t bytes_read = 0;     // chunk and manifest values received
  uint64_t writes_refused = 0;  // the store said no (e.g. OOM under maxmemory)
  uint64_t corrupt_values = 0;  // manifests or chunks that failed a check (deleted)
};

struct ProbeResult {
  Status status = Status::Unavailable;  // Ok (manifest set), NotFound, Corrupt, Unavailable
  Manifest manifest;
};

// A snapshot an anchor's index lists: its key (ns and key_hash as asked, position
// and tail digest from the field) and its tail token ids (the field's value).
struct IndexMember {
  EntryKey key;
  std::vector<int32_t> tail_tokens;
};
struct IndexResult {
  Status status = Status::Unavailable;  // Ok (members set), NotFound, Corrupt, Unavailable
  std::vector<IndexMember> members;     // at most index_fields_max
};

// One entry of a batched restore (RemoteStore::get_batch).
struct GetRequest {
  EntryKey key;
  const Manifest* manifest = nullptr;
  ImageTarget target;
};

// Whether an entry is restored in a pipelined batch: one chunk, a small image.
bool batchable(const Manifest& manifest);

class RemoteStore {
 public:
  // chunk_bytes: the size new records are cut at (chunk_bytes_min..chunk_bytes_max).
  RemoteStore(ClusterClient& client, uint32_t chunk_bytes);

  // Ok (written), AlreadyPresent (its manifest was there), Unavailable, IoError,
  // Corrupt (the image could not be read through its copy function).
  // `header` comes from manifest_header_for(key) with the caller's fields set; sizes
  // and chunking are filled in here.
  Status put(const EntryKey& key, ManifestHeader header, const ImageView& image);
  // One pipelined batch of manifest GETs; ret_results[i] answers keys[i].
  void probe(std::span<const EntryKey> keys, std::vector<ProbeResult>& ret_results);
  // One pipelined batch reading the snapshot index of each anchors[i] (its ns and
  // key_hash); ret_results[i] answers anchors[i].
  void probe_index(std::span<const EntryKey> anchors, std::vector<IndexResult>& ret_results);
  // Streams the entry's chunks into `target` (sized as the manifest says, or
  // InvalidArgument). Ok, NotFound (a chunk is gone), Corrupt (deleted), Unavailable,
  // IoError (the target could not be written through its copy function).
  Status get(const EntryKey& key, const Manifest& manifest, const ImageTarget& target);
  // Restores entries that are all batchable() in one pipelined batch of GETs (at most
  // batched_gets_max); ret_statuses[i] answers requests[i] as get() would.
  void get_batch(std::span<const GetRequest> requests, std::vector<Status>& ret_statuses);
  // Deletes the manifest first (readers stop seeing it), then the chunks (and a
  // snapshot's index field).
  void remove(const EntryKey& key, uint32_t chunk_count);

  const StoreCounters& counters() const { return counters_; }
  ClusterClient& client() { return client_; }

 private:
  // Checks chunk `index` of an entry (its size and checksum) while copying it into
  // `target`: Ok, NotFound (nil: evicted), Corrupt, Unavailable, IoError.
  Status take_chunk(const Reply& reply, const Manifest& manifest, const ImageTarget& target,
                    uint32_t index);
  // Sets (or clears) a snapshot's field in its anchor's index.
  Status index_set(const EntryKey& key, std::span<const int32_t> tail_tokens);
  void index_clear(const EntryKey& key);

  ClusterClient& client_;
  uint32_t chunk_bytes_;
  StoreCounters counters_;
};

}  // namespace kvpark::remote
