// A restore's slot file, written while it is being filled: the caller copies (and
// verifies) the next part into one staging buffer while a second thread write()s the
// one before, so a restore costs about the slower of the two, not their sum. On
// tmpfs the write is the slower: the kernel's work per page makes it cost about three
// memcpys of the same bytes (docs/proxy.md, "Restore path").
//
// Both ways the proxy writes a slot file use it: from blocks (state_blocks.h) and a
// whole parked file (parking.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "integrations/llama/state_blocks.h"

namespace kvpark::proxy {

class SlotFileWriter final : public llama::ImageOutput {
 public:
  SlotFileWriter() = default;
  ~SlotFileWriter();
  SlotFileWriter(const SlotFileWriter&) = delete;
  SlotFileWriter& operator=(const SlotFileWriter&) = delete;

  // Opens path to be written over in place from its start: not truncated, so the
  // pages a slot's last restore allocated are written again, not allocated afresh.
  // false with why.
  bool open(const std::string& path);

  // ImageOutput: room in the staging buffer being filled (waiting, when every buffer
  // is still being written, for the oldest); false from filled() once a write failed.
  uint8_t* space(size_t* ret_bytes) override;
  bool filled(size_t bytes) override;
  std::string why() const override;

  // Writes what is left, waits for every write and cuts the file at file_bytes (a
  // longer file of an earlier restore). false with why(); the caller removes the file.
  bool finish(uint64_t file_bytes);

 private:
  struct Staging {
    std::unique_ptr<uint8_t[]> bytes;
    size_t filled = 0;  // set when handed over
  };
  void write_staged();  // the writer thread
  void hand_over();     // the buffer being filled, to the writer
  void stop();

  int fd_ = -1;
  std::string path_;
  std::vector<Staging> staging_;
  size_t filling_bytes_ = 0;  // in the buffer being filled

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t handed_over_ = 0;  // buffers given to the writer; the one filled next is this one
  uint64_t written_ = 0;      // buffers the writer is done with
  bool stopping_ = false;
  bool failed_ = false;
  std::string why_;
  std::thread writer_;
};

}  // namespace kvpark::proxy
