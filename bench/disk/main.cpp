// kvpark-disk-bench: the disk-tier figures of issue 3, in one run on one directory.
//
//   kvpark-disk-bench [--dir DIR] [--quick] [--queue-depth N]
//
// 1. spill and restore throughput through DiskStore, each as a ratio to fio run here with
//    the same engine (io_uring), block size (the chunk, 1 MiB), queue depth, O_DIRECT,
//    sequential, same file sizes. Target >= 0.85.
// 2. restore latency of a 64 MiB record while a 4 GiB spill runs / idle. Target <= 1.5.
// 3. time to recover an index of 10k records at open.
// 4. layout: one file per record (create, O_DIRECT write, fdatasync, rename [, dir fsync])
//    against appending to one segment file (fdatasync per 64 MiB), 256 KiB and 4 MiB records.
// Exit: 0 when every section ran (a MISS is a figure), 1 when one failed, 2 bad flag,
// 77 when fio is missing (the ratio sections cannot be judged without it).
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "iouring/disk_store.h"
#include "proto/version.h"

using namespace kvpark;
using namespace kvpark::disk;

namespace {

constexpr double ratio_min = 0.85;
constexpr double latency_ratio_max = 1.5;
constexpr int latency_spills_max = 4;  // big spills started at most while sampling latency under load

struct Sizes {
  uint64_t record_bytes;  // section 1
  int records;
  uint64_t small_record_bytes;  // section 2: the restored record
  uint64_t big_spill_bytes;     // section 2: the spill running meanwhile
  int latency_samples;
  int recovery_records;  // section 3
  uint64_t recovery_record_bytes;
  int layout_small;  // section 4: records of 256 KiB
  int layout_large;  //            records of 4 MiB
};
constexpr Sizes full_sizes = {1ull << 30, 4, 64ull << 20, 4ull << 30, 7, 10000, 16384, 2000, 256};
constexpr Sizes quick_sizes = {64ull << 20, 2, 16ull << 20, 256ull << 20, 3, 500, 16384, 100, 16};

double now_sec() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Buffer {
  explicit Buffer(uint64_t n) : bytes(n) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, align_io(n)));
    uint64_t x = 0x9e3779b97f4a7c15ull ^ n;
    auto* words = reinterpret_cast<uint64_t*>(data);
    for (uint64_t i = 0; i < align_io(n) / 8; ++i) {
      x ^= x << 13; x ^= x >> 7; x ^= x << 17;
      words[i] = x;
    }
  }
  ~Buffer() { std::free(data); }
  uint8_t* data;
  uint64_t bytes;
};

RecordHeader meta_for(uint64_t key, uint64_t image_bytes) {
  RecordHeader h{};
  h.kind = static_cast<uint8_t>(EntryKind::Snapshot);
  h.namespace_id = Hash128{0xbe4c, 0xd15c};
  h.key_hash = Hash128{key, ~key};
  h.tail_digest = Hash128{key, 1};
  h.payload_bytes = image_bytes;
  h.image_bytes = image_bytes;
  return h;
}

std::vector<DiskCompletion> wait_all(DiskStore& store, size_t count) {
  std::vector<DiskCompletion> out;
  while (out.size() < count) {
    pollfd p{store.notify_fd(), POLLIN, 0};
    poll(&p, 1, 1000);
    store.take_completions(out);
  }
  return out;
}

bool all_ok(const std::vector<DiskCompletion>& done, const char* what) {
  for (const auto& c : done)
    if (c.status != Status::Ok) {
      fprintf(stderr, "%s failed: %s (%s)\n", what, std::string(status_name(c.status)).c_str(), strerror(c.err));
      return false;
    }
  return true;
}

std::unique_ptr<DiskStore> open_store(const std::string& dir, uint32_t depth, RecoveryReport* ret_report = nullptr,
                                      std::vector<iovec> fixed = {}) {
  DiskStoreOptions o;
  o.directory = dir;
  o.queue_depth = depth;
  o.fixed_buffers = std::move(fixed);
  std::unique_ptr<DiskStore> store;
  RecoveryReport report;
  OpenError err;
  Status s = DiskStore::open(std::move(o), store, report, &err);
  if (s != Status::Ok) {
    fprintf(stderr, "open %s: %s: %s\n", dir.c_str(), std::string(status_name(s)).c_str(), err.detail.c_str());
    return nullptr;
  }
  for (const auto& note : report.engine_notes) printf("  note: %s\n", note.c_str());
  if (ret_report) *ret_report = std::move(report);
  return store;
}

// Runs fio and returns the bandwidth of the direction in bytes/s, 0 on failure.
double run_fio(const std::string& dir, const char* rw, uint64_t file_bytes, int files, uint32_t depth) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "fio --name=kvpark --directory=%s --rw=%s --bs=1M --iodepth=%u --ioengine=io_uring --direct=1 "
           "--nrfiles=%d --filesize=%llu --size=%llu --file_service_type=sequential --fsync_on_close=1 "
           "--output-format=json 2>/dev/null",
           dir.c_str(), rw, depth, files, static_cast<unsigned long long>(file_bytes),
           static_cast<unsigned long long>(file_bytes * files));
  FILE* p = popen(cmd, "r");
  if (!p) return 0;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  std::string key = std::string("\"") + (rw[0] == 'r' ? "read" : "write") + "\" : {";
  size_t at = out.find(key);
  if (at == std::string::npos) return 0;
  at = out.find("\"bw_bytes\"", at);
  if (at == std::string::npos) return 0;
  at = out.find(':', at);
  return strtod(out.c_str() + at + 1, nullptr);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// ---- 1. throughput against fio ----
bool bench_throughput(const std::string& root, const Sizes& z, uint32_t depth) {
  printf("\n[1] throughput vs fio (io_uring, O_DIRECT, bs 1 MiB, iodepth %u, %d files of %llu MiB)\n", depth,
         z.records, static_cast<unsigned long long>(z.record_bytes >> 20));
  std::string dir = root + "/throughput";
  Buffer src(z.record_bytes);
  Buffer dst(z.record_bytes);
  auto store = open_store(dir, depth, nullptr, {iovec{src.data, src.bytes}, iovec{dst.data, dst.bytes}});
  if (!store) return false;
  double t0 = now_sec();
  std::vector<RecordId> ids;
  for (int i = 0; i < z.records; ++i) ids.push_back(store->spill(meta_for(i, z.record_bytes), src.data));
  if (!all_ok(wait_all(*store, z.records), "spill")) return false;
  double spill_bps = z.records * static_cast<double>(z.record_bytes) / (now_sec() - t0);
  t0 = now_sec();
  for (int i = 0; i < z.records; ++i) {
    store->restore(ids[i], dst.data, z.record_bytes);
    if (!all_ok(wait_all(*store, 1), "restore")) return false;
  }
  double restore_bps = z.records * static_cast<double>(z.record_bytes) / (now_sec() - t0);
  if (memcmp(src.data, dst.data, z.record_bytes) != 0) {
    fprintf(stderr, "restore not bit-exact\n");
    return false;
  }
  store.reset();
  std::filesystem::remove_all(dir);

  std::string fio_dir = root + "/fio";
  std::filesystem::create_directories(fio_dir);
  double fio_write = run_fio(fio_dir, "write", z.record_bytes, z.records, depth);
  double fio_read = run_fio(fio_dir, "read", z.record_bytes, z.records, depth);
  std::filesystem::remove_all(fio_dir);
  if (fio_write <= 0 || fio_read <= 0) {
    fprintf(stderr, "fio produced no figure\n");
    return false;
  }
  printf("  spill    %8.1f MB/s   fio write %8.1f MB/s   ratio %.2f  (target >= %.2f) %s\n", spill_bps / 1e6,
         fio_write / 1e6, spill_bps / fio_write, ratio_min, spill_bps / fio_write >= ratio_min ? "ok" : "MISS");
  printf("  restore  %8.1f MB/s   fio read  %8.1f MB/s   ratio %.2f  (target >= %.2f) %s\n", restore_bps / 1e6,
         fio_read / 1e6, restore_bps / fio_read, ratio_min, restore_bps / fio_read >= ratio_min ? "ok" : "MISS");
  printf("  (restore verifies every 1 MiB chunk's XXH3-64; spill includes fdatasync, rename, directory fsync)\n");
  return true;
}

// ---- 2. restore latency under a large spill ----
bool bench_latency(const std::string& root, const Sizes& z, uint32_t depth) {
  printf("\n[2] restore latency of a %llu MiB record: idle vs during a %llu MiB spill\n",
         static_cast<unsigned long long>(z.small_record_bytes >> 20),
         static_cast<unsigned long long>(z.big_spill_bytes >> 20));
  std::string dir = root + "/latency";
  Buffer small(z.small_record_bytes), dst(z.small_record_bytes), big(z.big_spill_bytes);
  auto store = open_store(dir, depth, nullptr, {iovec{dst.data, dst.bytes}});
  if (!store) return false;
  RecordId id = store->spill(meta_for(1, z.small_record_bytes), small.data);
  if (!all_ok(wait_all(*store, 1), "spill")) return false;
  auto restore_once = [&]() -> double {
    double t = now_sec();
    store->restore(id, dst.data, z.small_record_bytes);
    auto done = wait_all(*store, 1);
    if (!all_ok(done, "restore")) return -1;
    return now_sec() - t;
  };
  std::vector<double> idle, loaded;
  for (int i = 0; i < z.latency_samples; ++i) idle.push_back(restore_once());
  // Keep a big spill in flight for every loaded sample: when one finishes, the
  // sample that overlapped its end is dropped and the next spill starts at once.
  // A disk fast enough to finish every spill before a sample completes gets no
  // loaded figure: that is reported, never a failure (no sleep decides it).
  uint64_t spill_job = 0;
  uint64_t spill_key = 2;
  store->spill(meta_for(spill_key, z.big_spill_bytes), big.data, &spill_job);
  int spills_started = 1;
  bool spill_in_flight = true;
  // Each pass either takes a sample or ends a spill, and spills are bounded: it ends.
  while (static_cast<int>(loaded.size()) < z.latency_samples) {
    if (!spill_in_flight) {
      if (spills_started >= latency_spills_max) break;
      store->spill(meta_for(++spill_key, z.big_spill_bytes), big.data, &spill_job);
      ++spills_started;
      spill_in_flight = true;
    }
    double t = now_sec();
    store->restore(id, dst.data, z.small_record_bytes);
    bool spill_ended = false;
    for (;;) {
      pollfd p{store->notify_fd(), POLLIN, 0};
      poll(&p, 1, 1000);
      std::vector<DiskCompletion> done;
      store->take_completions(done);
      bool restored = false;
      for (auto& c : done) {
        if (c.job_id == spill_job) {
          if (c.status != Status::Ok) return false;
          spill_ended = true;
        } else if (c.status == Status::Ok) {
          restored = true;
        } else {
          return false;
        }
      }
      if (restored) break;
    }
    if (spill_ended) {  // the sample overlapped the end of the spill: not counted
      spill_in_flight = false;
      continue;
    }
    loaded.push_back(now_sec() - t);
  }
  if (spill_in_flight && !all_ok(wait_all(*store, 1), "spill")) return false;
  if (loaded.empty()) {
    printf("  idle median %.1f ms; no loaded sample: each of %d spills of %llu MiB finished within one restore "
           "(disk too fast for this size; not judged)\n",
           median(idle) * 1e3, spills_started, static_cast<unsigned long long>(z.big_spill_bytes >> 20));
    store.reset();
    std::filesystem::remove_all(dir);
    return true;
  }
  double ratio = median(loaded) / median(idle);
  printf("  idle median %.1f ms, under spill median %.1f ms (%zu samples)  ratio %.2f  (target <= %.1f) %s\n",
         median(idle) * 1e3, median(loaded) * 1e3, loaded.size(), ratio, latency_ratio_max,
         ratio <= latency_ratio_max ? "ok" : "MISS");
  store.reset();
  std::filesystem::remove_all(dir);
  return true;
}

// ---- 3. recovery time ----
bool bench_recovery(const std::string& root, const Sizes& z, uint32_t depth) {
  printf("\n[3] recovery: index %d records of %llu KiB at open\n", z.recovery_records,
         static_cast<unsigned long long>(z.recovery_record_bytes >> 10));
  std::string dir = root + "/recovery";
  Buffer src(z.recovery_record_bytes);
  {
    auto store = open_store(dir, depth);
    if (!store) return false;
    double t0 = now_sec();
    for (int i = 0; i < z.recovery_records; ++i) store->spill(meta_for(i, z.recovery_record_bytes), src.data);
    if (!all_ok(wait_all(*store, z.recovery_records), "spill")) return false;
    double dt = now_sec() - t0;
    printf("  wrote them through DiskStore in %.2f s (%.0f records/s)\n", dt, z.recovery_records / dt);
  }
  for (const char* pass : {"warm cache", "cold cache"}) {
    if (pass[0] == 'c') {
      sync();
      int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
      if (fd < 0 || write(fd, "3", 1) != 1) {
        printf("  cold-cache pass skipped: cannot drop caches (needs root)\n");
        if (fd >= 0) close(fd);
        break;
      }
      close(fd);
    }
    RecoveryReport report;
    auto store = open_store(dir, depth, &report);
    if (!store) return false;
    if (report.records.size() != static_cast<size_t>(z.recovery_records)) {
      fprintf(stderr, "recovered %zu of %d records\n", report.records.size(), z.recovery_records);
      return false;
    }
    printf("  open (%s): %zu records in %.1f ms\n", pass, report.records.size(), report.scan_usec / 1e3);
  }
  std::filesystem::remove_all(dir);
  return true;
}

// ---- 4. layout ----
struct LayoutFigure {
  double records_per_sec;
  double mb_per_sec;
};

LayoutFigure layout_files(const std::string& dir, const Buffer& src, int n, bool dir_fsync) {
  std::filesystem::create_directories(dir);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  double t0 = now_sec();
  for (int i = 0; i < n; ++i) {
    std::string tmp = dir + "/" + std::to_string(i) + ".tmp", fin = dir + "/" + std::to_string(i) + ".kvr";
    int fd = open(tmp.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_DIRECT, 0640);
    if (fd < 0 || pwrite(fd, src.data, src.bytes, 0) != static_cast<ssize_t>(src.bytes)) abort();
    fdatasync(fd);
    close(fd);
    rename(tmp.c_str(), fin.c_str());
    if (dir_fsync) fsync(dfd);
  }
  double dt = now_sec() - t0;
  close(dfd);
  std::filesystem::remove_all(dir);
  return {n / dt, n * static_cast<double>(src.bytes) / dt / 1e6};
}

LayoutFigure layout_segment(const std::string& dir, const Buffer& src, int n) {
  std::filesystem::create_directories(dir);
  std::string path = dir + "/segment";
  int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_DIRECT, 0640);
  if (fd < 0) abort();
  constexpr uint64_t sync_every = 64ull << 20;
  uint64_t off = 0, since_sync = 0;
  double t0 = now_sec();
  for (int i = 0; i < n; ++i) {
    if (pwrite(fd, src.data, src.bytes, static_cast<off_t>(off)) != static_cast<ssize_t>(src.bytes)) abort();
    off += src.bytes;
    since_sync += src.bytes;
    if (since_sync >= sync_every) {
      fdatasync(fd);
      since_sync = 0;
    }
  }
  fdatasync(fd);
  double dt = now_sec() - t0;
  close(fd);
  std::filesystem::remove_all(dir);
  return {n / dt, n * static_cast<double>(src.bytes) / dt / 1e6};
}

LayoutFigure layout_store(const std::string& dir, const Buffer& src, int n, uint32_t depth) {
  auto store = open_store(dir, depth);
  if (!store) return {0, 0};
  double t0 = now_sec();
  for (int i = 0; i < n; ++i) store->spill(meta_for(i, src.bytes), src.data);
  bool ok = all_ok(wait_all(*store, n), "spill");
  double dt = now_sec() - t0;
  store.reset();
  std::filesystem::remove_all(dir);
  return ok ? LayoutFigure{n / dt, n * static_cast<double>(src.bytes) / dt / 1e6} : LayoutFigure{0, 0};
}

bool bench_layout(const std::string& root, const Sizes& z, uint32_t depth) {
  printf("\n[4] layout: one file per record vs one segment file (synchronous pwrite, O_DIRECT)\n");
  printf("  %-8s %-44s %12s %10s\n", "record", "variant", "records/s", "MB/s");
  struct Size { uint64_t bytes; int n; } sizes[] = {{256 * 1024, z.layout_small}, {4ull << 20, z.layout_large}};
  for (const Size& s : sizes) {
    Buffer src(s.bytes);
    std::string label = s.bytes >= (1 << 20) ? std::to_string(s.bytes >> 20) + " MiB" : std::to_string(s.bytes >> 10) + " KiB";
    auto row = [&](const char* variant, LayoutFigure f) {
      printf("  %-8s %-44s %12.0f %10.1f\n", label.c_str(), variant, f.records_per_sec, f.mb_per_sec);
    };
    row("file/record: create+write+fdatasync+rename", layout_files(root + "/layout-f", src, s.n, false));
    row("file/record: ... + directory fsync", layout_files(root + "/layout-fd", src, s.n, true));
    row("segment: append, fdatasync per 64 MiB", layout_segment(root + "/layout-s", src, s.n));
    LayoutFigure st = layout_store(root + "/layout-store", src, s.n, depth);
    if (st.records_per_sec == 0) return false;
    row("DiskStore.spill (pipelined, durable each)", st);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/var/tmp/kvpark-bench";
  bool quick = false;
  uint32_t depth = queue_depth_default;
  static option longopts[] = {{"dir", required_argument, nullptr, 'd'},
                              {"quick", no_argument, nullptr, 'q'},
                              {"queue-depth", required_argument, nullptr, 'Q'},
                              {"help", no_argument, nullptr, 'h'},
                              {"version", no_argument, nullptr, 'V'},
                              {nullptr, 0, nullptr, 0}};
  const char* usage_text =
      "Usage: kvpark-disk-bench [--dir DIR] [--quick] [--queue-depth N]\n"
      "Measures the disk tier's record I/O against fio on the same file system.\n\n"
      "  --dir DIR         where to write (default /var/tmp/kvpark-bench)\n"
      "  --quick           small sizes (a smoke test)\n"
      "  --queue-depth N   spills in flight\n"
      "  -h, --help        this help\n"
      "      --version     the version\n";
  for (int c; (c = getopt_long(argc, argv, "h", longopts, nullptr)) != -1;) {
    if (c == 'h') {
      fputs(usage_text, stdout);
      return 0;
    }
    if (c == 'V') {
      printf("kvpark-disk-bench %s\n", kvpark::version);
      return 0;
    }
    if (c == 'd') dir = optarg;
    else if (c == 'q') quick = true;
    else if (c == 'Q') depth = static_cast<uint32_t>(atoi(optarg));
    else {
      fputs(usage_text, stderr);
      return 2;
    }
  }
  if (system("fio --version >/dev/null 2>&1") != 0) {
    printf("SKIP: fio is not installed (apt-get install fio); the ratios need it\n");
    return 77;
  }
  std::filesystem::create_directories(dir);
  std::string root = dir + "/run-" + std::to_string(getpid());
  std::filesystem::create_directories(root);
  const Sizes& z = quick ? quick_sizes : full_sizes;
  printf("kvpark-disk-bench %s on %s (queue depth %u, chunk 1 MiB)\n", quick ? "--quick" : "", root.c_str(), depth);
  bool ok = bench_throughput(root, z, depth);
  ok = bench_latency(root, z, depth) && ok;
  ok = bench_recovery(root, z, depth) && ok;
  ok = bench_layout(root, z, depth) && ok;
  std::filesystem::remove_all(root);
  return ok ? 0 : 1;
}
