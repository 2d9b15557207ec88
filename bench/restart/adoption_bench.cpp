// kvpark-adoption-bench: what rebuilding the index from a kept state segment costs,
// by entry count, in one run on one machine.
//
// For each row the bench writes a state segment as a daemon would have left it (one
// namespace, N sealed block records with random chain hashes, their extents filling
// an arena of the given size in an order unrelated to the records', as after long
// churn), then, in a fresh process as a restarted kvparkd is, maps it again
// (StateSegment::adopt on the kept fd) and times adopt_entries() into a fresh entry
// table: wall time, and the process's CPU time, every thread's (the figure that holds
// on a loaded machine: it excludes waiting for a core, and includes page faults;
// adoption indexes its block batches on a helper thread). The same
// process then adopts once more into the memory the first adoption freed: the work
// itself, without first-touching fresh memory. Then, as under a service manager, one
// process adopts into index memory kept in a memfd and leaves its pages there, and
// three fresh processes in a row adopt over what the one before kept
// (daemon/kept_memory.h): the "kept" figures, mapping the kept memory included, are
// their median and the fastest. Every clock stops when the table is built, as a
// restarting daemon's does. Next to it, each in a process of its
// own: the floor (mapping the records and checking them), and what
// first-touching fresh memory the size of the index costs on 4 KiB pages and on huge
// pages (the entry table's bulk is on huge pages where the kernel allows:
// daemon/huge_page_allocator.h). These run after the adoption, and in a VM whose host
// backs guest memory lazily they may get memory it freed, already backed. Adoption
// reads no arena page of a block, so the arena itself is only a size here.
//
// Last, as a daemon that stopped cleanly leaves it: the index image (daemon/index_image.h).
// One process adopts over the kept memory and leaves its index as an image; then
// three fresh processes in a row each adopt the image the one before left (mapping the
// kept memory included) and leave it again: "image" is their median and fastest, and
// "stop" the median time a stop spends leaving the image.
//
// --huge-pages allows huge pages for the state segment and the kept index memory, as
// kvparkd does with huge_pages = try or on: reserved ones (vm.nr_hugepages) when some
// are free, else transparent ones where shmem_enabled gives them; each row says what
// they got. Without it both are on 4 KiB pages.
//
// --kept-only runs the kept restarts alone, more of them, each figure printed: what to
// run under a profiler (`perf record`), where the other rows would only add samples.
//
// --kept-memory-dir DIR makes both in DIR, a tmpfs (kvparkd's kept_memory_dir): mounted
// with huge=within_size it gives them 2 MiB pages whatever shmem_enabled says (with
// --huge-pages; reserved ones still come first).
//
//   kvpark-adoption-bench [--quick] [--kept-only] [--huge-pages] [--kept-memory-dir DIR]
//                         [--entries N ...]
#include <fcntl.h>
#include <getopt.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "daemon/adoption.h"
#include "daemon/block_index.h"
#include "daemon/entry_state.h"
#include "daemon/entry_table.h"
#include "daemon/huge_page_allocator.h"
#include "daemon/index_image.h"
#include "daemon/kept_memory.h"
#include "proto/limits.h"
#include "shm/arena.h"
#include "shm/state_segment.h"

namespace {

using namespace kvpark;

constexpr uint64_t extent_bytes = 2 * limits::extent_align_bytes;  // the smallest entry
constexpr NamespaceId bench_ns{0x7e57a7, 0x7e57a7};
constexpr uint32_t block_tokens = 16;
bool use_huge_pages = false;  // --huge-pages
std::string kept_directory;   // --kept-memory-dir

// Restarts over kept index memory per row: this figure is the one a restarted daemon
// meets, and on a shared machine one run alone swings by half.
constexpr int kept_runs = 3;
constexpr int kept_only_runs = 8;
// A block's share of the index: at most two cells (daemon/block_index.h).
constexpr size_t index_node_bytes = 2 * daemon::BlockIndex::cell_bytes;

double clock_msec(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}
double now_msec() { return clock_msec(CLOCK_MONOTONIC); }
// Each measurement runs in a process of its own: its CPU time is the adoption's.
double cpu_msec() {
  return clock_msec(CLOCK_PROCESS_CPUTIME_ID);
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "kvpark-adoption-bench: %s\n", what);
  std::exit(1);
}

// A kept segment holding `entries` sealed blocks; returns its fd (the segment unmapped).
int write_kept_segment(uint64_t entries, uint64_t arena_bytes) {
  std::unique_ptr<shm::StateSegment> segment;
  int err = 0;
  if (shm::StateSegment::create({.arena_identity = 1,
                                 .arena_data_bytes = arena_bytes,
                                 .configured_arena_bytes = arena_bytes,
                                 .huge_pages = static_cast<uint16_t>(
                                     use_huge_pages ? shm::HugePages::Try : shm::HugePages::Off)},
                                segment, err, kept_directory) != Status::Ok) {
    fail("cannot create a state segment");
  }
  shm::NamespaceRecord ns{};
  ns.id = bench_ns;
  ns.block_tokens = block_tokens;
  ns.block_payload_bytes = extent_bytes - limits::entry_header_bytes;
  segment->write_namespace(0, ns);
  std::mt19937_64 random(entries);
  std::vector<uint64_t> extents(entries);
  for (uint64_t i = 0; i < entries; ++i) extents[i] = i * extent_bytes;
  std::shuffle(extents.begin(), extents.end(), random);
  Hash128 parent{};
  for (uint64_t i = 0; i < entries; ++i) {
    shm::StateRecordBody body{};
    body.namespace_id = bench_ns;
    body.key_hash = {random(), random()};
    body.parent_hash = parent;
    body.extent_offset = extents[i];
    body.extent_bytes = extent_bytes;
    body.payload_checksum = random();
    body.position = static_cast<uint32_t>(i % 1024);
    body.kind = static_cast<uint8_t>(EntryKind::Block);
    segment->write_record(i, body, 1, 0);
    parent = body.key_hash;
  }
  const int fd = dup(segment->fd());
  if (fd < 0) fail("dup");
  return fd;  // the segment's own mapping and fd go with it
}

// The floor any adoption pays, measured in the same run: mapping the records and
// checking each (CPU time).
double floor_msec(int fd, uint64_t entries) {
  std::unique_ptr<shm::StateSegment> segment;
  int err = 0;
  const int copy = dup(fd);
  if (copy < 0 || shm::StateSegment::adopt(copy, segment, err) != Status::Ok) fail("adopt (floor)");
  const double start = cpu_msec();
  uint64_t valid = 0;
  const shm::RecordsToAdopt adopting = segment->records_to_adopt();
  for (const shm::StateRecord& record : adopting.records()) {
    const shm::StateRecord read = record;
    valid += shm::StateSegment::check(read) == shm::StateSegment::RecordCheck::Valid;
  }
  if (valid != entries) fail("floor: records not valid");
  return cpu_msec() - start;
}

// First-touching fresh memory the size of the index (an Entry and a hash node per
// entry), on 4 KiB pages or on huge pages as the entry table asks for them (CPU
// time: the faults are the kernel's work on this process's one thread).
double touch_msec(uint64_t entries, bool huge) {
  const size_t index_bytes = entries * (sizeof(daemon::Entry) + index_node_bytes);
  void* fresh = nullptr;
  if (huge) {
    fresh = daemon::map_huge_pages(index_bytes);
  } else {
    fresh = mmap(nullptr, index_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) fail("mmap");
  }
  const double start = cpu_msec();
  for (size_t at = 0; at < index_bytes; at += 4096) static_cast<volatile uint8_t*>(fresh)[at] = 1;
  const double elapsed = cpu_msec() - start;
  if (huge) {
    daemon::unmap_huge_pages(fresh, index_bytes);
  } else {
    munmap(fresh, index_bytes);
  }
  return elapsed;
}

// What backs the state segment and the index memory, as the bench found it.
enum class Pages : uint8_t { Small, Transparent, Reserved };
const char* pages_name(Pages pages) {
  switch (pages) {
    case Pages::Small:
      return "4 KiB pages";
    case Pages::Transparent:
      return "transparent huge pages";
    case Pages::Reserved:
      return "reserved huge pages";
  }
  return "?";
}

struct Row {
  uint64_t entries = 0, arena_bytes = 0, adopted = 0, dropped = 0;
  double adopt_msec = 0, adopt_cpu_msec = 0, kept_msec = 0, kept_cpu_msec = 0, kept_min_msec = 0,
         again_cpu_msec = 0, floor_msec = 0, touch_4k_msec = 0, touch_huge_msec = 0, image_msec = 0,
         image_cpu_msec = 0, image_min_msec = 0, stop_msec = 0;
  Pages state_pages = Pages::Small, index_pages = Pages::Small;  // as measured
};

// Runs `measure` in a forked child and returns what it filled in. Each figure comes
// from a process of its own, as a restarted kvparkd is: in one process, memory freed
// by an earlier step is handed back already backed, and a later step looks faster
// than a restart would (docs/operations.md has the figures).
template <typename Measure>
Row in_fresh_process(const Row& row, Measure measure) {
  int out[2];
  if (pipe(out) != 0) fail("pipe");
  const pid_t child = fork();
  if (child < 0) fail("fork");
  if (child == 0) {
    close(out[0]);
    Row filled = row;
    measure(filled);
    const bool sent = write(out[1], &filled, sizeof filled) == static_cast<ssize_t>(sizeof filled);
    _exit(sent ? 0 : 1);
  }
  close(out[1]);
  Row filled{};
  const bool got = read(out[0], &filled, sizeof filled) == static_cast<ssize_t>(sizeof filled);
  close(out[0]);
  int status = 0;
  waitpid(child, &status, 0);
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0) fail("a measuring process failed");
  return filled;
}

// One adoption into a fresh entry table, with the clocks started at wall_start
// (now_msec) and cpu_start (cpu_msec); returns wall ms, and CPU ms in ret_cpu_msec.
// The clocks stop when the table is built, as a restarting daemon's do: tearing the
// table down again is not counted.
double adopt_once(int fd, Row& row, double wall_start, double cpu_start, double& ret_cpu_msec) {
  std::unique_ptr<shm::StateSegment> segment;
  int err = 0;
  const int copy = dup(fd);
  if (copy < 0 || shm::StateSegment::adopt(copy, segment, err) != Status::Ok) fail("adopt");
  daemon::EntryState state(*segment);
  daemon::EntryTable table(row.arena_bytes, limits::extent_align_bytes);
  table.set_state(&state);
  const daemon::AdoptionReport report =
      daemon::adopt_entries(state, nullptr, row.arena_bytes, table);
  const double wall = now_msec() - wall_start;
  ret_cpu_msec = cpu_msec() - cpu_start;
  row.adopted = report.entries;
  row.dropped = report.dropped_total();
  if (row.adopted != row.entries || row.dropped != 0) fail("adoption lost entries");
  return wall;
}

// An adoption in this process with the index memory over `memory_fd` (kept_memory.h),
// mapping it included; returns wall ms, and CPU ms in ret_cpu_msec. It leaves the pages
// to the next one, as a stopping daemon does.
// The kept memory over `memory_fd`, in use for the entry table's arrays from now on.
std::unique_ptr<daemon::KeptMemory> use_kept_memory_fd(int memory_fd) {
  std::unique_ptr<daemon::KeptMemory> memory;
  int err = 0;
  if (daemon::KeptMemory::open(dup(memory_fd), use_huge_pages, memory, err) != Status::Ok)
    fail("kept memory");
  daemon::use_kept_memory(memory.get());
  return memory;
}

double adopt_over_kept_memory(int fd, int memory_fd, Row& row, double& ret_cpu_msec) {
  const double start = now_msec();
  const double cpu_start = cpu_msec();
  const std::unique_ptr<daemon::KeptMemory> memory = use_kept_memory_fd(memory_fd);
  // Before adopt_once() frees the table on its way out (nothing else is freed before).
  memory->keep_pages();
  return adopt_once(fd, row, start, cpu_start, ret_cpu_msec);
}

// A restart over the kept memory that adopts the index image the last one left (or, with
// `rebuild`, rebuilds the index from the records), then stops cleanly, leaving the
// image for the next. Returns the adoption's wall ms (mapping the kept memory included);
// CPU ms in ret_cpu_msec, the stop's wall ms in ret_stop_msec.
double adopt_image_over_kept_memory(int fd, int memory_fd, bool rebuild, Row& row,
                                    double& ret_cpu_msec, double& ret_stop_msec) {
  const double start = now_msec();
  const double cpu_start = cpu_msec();
  const std::unique_ptr<daemon::KeptMemory> memory = use_kept_memory_fd(memory_fd);
  int err = 0;
  std::unique_ptr<shm::StateSegment> segment;
  const int copy = dup(fd);
  if (copy < 0 || shm::StateSegment::adopt(copy, segment, err) != Status::Ok) fail("adopt");
  daemon::EntryState state(*segment);
  daemon::EntryTable table(row.arena_bytes, limits::extent_align_bytes);
  table.set_state(&state);
  daemon::AdoptionReport report;
  std::string why_not;
  if (rebuild) {
    report = daemon::adopt_entries(state, nullptr, row.arena_bytes, table);
  } else if (!daemon::adopt_index_image(*memory, state, nullptr, row.arena_bytes, table, report,
                                        why_not)) {
    fail(("the index image was not adopted: " + why_not).c_str());
  }
  const double wall = now_msec() - start;
  ret_cpu_msec = cpu_msec() - cpu_start;
  if (report.entries != row.entries) fail("adoption lost entries");
  row.state_pages = segment->on_huge_pages()          ? Pages::Reserved
                    : segment->on_transparent_pages() ? Pages::Transparent
                                                      : Pages::Small;
  row.index_pages = memory->huge_pages()          ? Pages::Reserved
                    : memory->transparent_pages() ? Pages::Transparent
                                                  : Pages::Small;
  const double stop_start = now_msec();
  if (!daemon::write_index_image(table, state, *memory, why_not))
    fail(("no index image left: " + why_not).c_str());
  ret_stop_msec = now_msec() - stop_start;
  return wall;
}

Row measure(uint64_t entries, bool kept_only) {
  Row row{.entries = entries, .arena_bytes = entries * extent_bytes};
  const int fd = write_kept_segment(entries, row.arena_bytes);
  if (!kept_only)
    row = in_fresh_process(row, [&](Row& r) {
      r.adopt_msec = adopt_once(fd, r, now_msec(), cpu_msec(), r.adopt_cpu_msec);
      // Into the memory the first one freed.
      (void)adopt_once(fd, r, now_msec(), cpu_msec(), r.again_cpu_msec);
    });
  // Under a service manager: an instance adopts into index memory it keeps, stops, and
  // the next one adopts over the pages it left (what kvparkd does, daemon/main.cpp).
  int memory_fd = -1;
  {
    std::unique_ptr<daemon::KeptMemory> memory;
    int err = 0;
    if (daemon::KeptMemory::open(-1, use_huge_pages, memory, err, kept_directory) != Status::Ok)
      fail("kept memory");
    memory_fd = dup(memory->fd());
  }
  row = in_fresh_process(row, [&](Row& r) {
    double cpu = 0;
    (void)adopt_over_kept_memory(fd, memory_fd, r, cpu);
  });
  // Several restarts in a row, each over what the one before kept: the median.
  std::vector<std::pair<double, double>> kept;  // wall, CPU
  const int runs = kept_only ? kept_only_runs : kept_runs;
  for (int run = 0; run < runs; ++run) {
    const Row done = in_fresh_process(row, [&](Row& r) {
      r.kept_msec = adopt_over_kept_memory(fd, memory_fd, r, r.kept_cpu_msec);
    });
    kept.emplace_back(done.kept_msec, done.kept_cpu_msec);
    if (kept_only)
      std::printf("kept restart %d: %.1f ms, CPU %.1f ms\n", run + 1, done.kept_msec,
                  done.kept_cpu_msec);
  }
  std::sort(kept.begin(), kept.end());
  row.kept_min_msec = kept.front().first;
  std::tie(row.kept_msec, row.kept_cpu_msec) = kept[kept.size() / 2];
  // Clean stops: each restart adopts the index image the one before left.
  row = in_fresh_process(row, [&](Row& r) {
    double cpu = 0, stop = 0;
    (void)adopt_image_over_kept_memory(fd, memory_fd, true, r, cpu, stop);
  });
  std::vector<std::pair<double, double>> images;  // wall, CPU
  std::vector<double> stops;
  for (int run = 0; run < runs; ++run) {
    const Row done = in_fresh_process(row, [&](Row& r) {
      r.image_msec =
          adopt_image_over_kept_memory(fd, memory_fd, false, r, r.image_cpu_msec, r.stop_msec);
    });
    images.emplace_back(done.image_msec, done.image_cpu_msec);
    stops.push_back(done.stop_msec);
    if (kept_only)
      std::printf("image restart %d: %.1f ms, CPU %.1f ms, stop %.1f ms\n", run + 1,
                  done.image_msec, done.image_cpu_msec, done.stop_msec);
  }
  std::sort(images.begin(), images.end());
  std::sort(stops.begin(), stops.end());
  row.image_min_msec = images.front().first;
  std::tie(row.image_msec, row.image_cpu_msec) = images[images.size() / 2];
  row.stop_msec = stops[stops.size() / 2];
  close(memory_fd);
  if (kept_only) {
    close(fd);
    return row;
  }
  row = in_fresh_process(row, [&](Row& r) { r.floor_msec = floor_msec(fd, entries); });
  row = in_fresh_process(row, [&](Row& r) { r.touch_4k_msec = touch_msec(entries, false); });
  row = in_fresh_process(row, [&](Row& r) { r.touch_huge_msec = touch_msec(entries, true); });
  close(fd);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> counts;
  bool quick = false, kept_only = false;
  const option long_options[] = {{"quick", no_argument, nullptr, 'q'},
                                 {"kept-only", no_argument, nullptr, 'k'},
                                 {"huge-pages", no_argument, nullptr, 'h'},
                                 {"entries", required_argument, nullptr, 'n'},
                                 {"kept-memory-dir", required_argument, nullptr, 'd'},
                                 {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "", long_options, nullptr)) != -1;) {
    if (c == 'q') {
      quick = true;
    } else if (c == 'k') {
      kept_only = true;
    } else if (c == 'h') {
      use_huge_pages = true;
    } else if (c == 'd') {
      kept_directory = optarg;
    } else if (c == 'n') {
      counts.push_back(std::strtoull(optarg, nullptr, 0));
    } else {
      std::fprintf(stderr,
                   "Usage: kvpark-adoption-bench [--quick] [--kept-only] [--huge-pages] "
                   "[--kept-memory-dir DIR] [--entries N ...]\n");
      return 2;
    }
  }
  if (counts.empty()) {
    counts =
        quick ? std::vector<uint64_t>{10'000} : std::vector<uint64_t>{10'000, 100'000, 1'000'000};
  }
  std::printf(
      "kvpark-adoption-bench: sealed blocks of %llu KiB extents, arena sized to hold them; %s\n",
      static_cast<unsigned long long>(extent_bytes >> 10),
      use_huge_pages ? "huge pages allowed for the state segment and index memory"
                     : "huge pages off (--huge-pages allows them)");
  std::printf("%10s %9s %9s %9s %9s %9s %9s %9s %9s %9s %10s %10s %9s %9s %9s %9s\n", "entries",
              "arena GiB", "adopt ms", "cpu ms", "ns/entry", "kept ms", "kept cpu", "kept min",
              "again ms", "floor ms", "4k-touch", "huge-touch", "image ms", "image cpu",
              "image min", "stop ms");
  for (uint64_t n : counts) {
    if (n == 0) continue;
    const Row r = measure(n, kept_only);
    std::printf(
        "%10llu %9.2f %9.1f %9.1f %9.0f %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f %10.1f %9.1f "
        "%9.1f %9.1f %9.1f\n",
        static_cast<unsigned long long>(r.entries),
        static_cast<double>(r.arena_bytes) / (1ull << 30), r.adopt_msec, r.adopt_cpu_msec,
        r.adopt_cpu_msec * 1e6 / static_cast<double>(r.entries), r.kept_msec, r.kept_cpu_msec,
        r.kept_min_msec, r.again_cpu_msec, r.floor_msec, r.touch_4k_msec, r.touch_huge_msec,
        r.image_msec, r.image_cpu_msec, r.image_min_msec, r.stop_msec);
    std::printf("  (state segment on %s, index memory on %s)\n", pages_name(r.state_pages),
                pages_name(r.index_pages));
  }
  std::printf(
      "each figure from a process of its own, as a restarted daemon is.\n"
      "adopt: wall and CPU time (all threads), in fresh memory; ns/entry from CPU time;\n"
      "kept: wall and CPU time with the index memory an earlier process kept (the fd\n"
      "store: daemon/kept_memory.h), mapping it included: the median of %d restarts in\n"
      "a row, and the fastest (kept min); again: a second\n"
      "adoption in the same process, into memory the first freed (CPU ms); floor:\n"
      "reading and checking the records; 4k-touch / huge-touch: first-touching memory\n"
      "the size of the index on 4 KiB / huge pages (CPU ms); image: wall and CPU time\n"
      "adopting the index image a clean stop left (daemon/index_image.h), mapping the\n"
      "kept memory included, median and fastest of as many restarts; stop: the median\n"
      "time a clean stop spends leaving the image\n",
      kept_only ? kept_only_runs : kept_runs);
  return 0;
}
