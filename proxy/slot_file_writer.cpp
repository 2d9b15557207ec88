#include "proxy/slot_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <new>
#include <system_error>

namespace kvpark::proxy {
namespace {

// Staging between arena and file: the buffers together stay within the L2 cache the
// verified copy fills them through, and each is large enough that a hand-over (a
// lock and a wake-up) costs little beside its write.
constexpr size_t staging_buffer_bytes = 512u << 10;
constexpr size_t staging_buffer_count = 4;

}  // namespace

SlotFileWriter::~SlotFileWriter() {
  stop();
  if (fd_ >= 0) close(fd_);
}

bool SlotFileWriter::open(const std::string& path) {
  assert(fd_ < 0);
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
  if (fd_ < 0) {
    why_ = path + ": " + std::strerror(errno);
    return false;
  }
  staging_.resize(staging_buffer_count);
  // No zeroing: only what the caller filled is written.
  for (Staging& s : staging_) s.bytes.reset(new (std::nothrow) uint8_t[staging_buffer_bytes]);
  const bool staged = std::all_of(staging_.begin(), staging_.end(),
                                  [](const Staging& s) { return s.bytes != nullptr; });
  try {
    if (staged) writer_ = std::thread([this] { write_staged(); });
  } catch (const std::system_error& e) {
    why_ = path + ": no thread to write it: " + e.what();
  }
  if (!writer_.joinable()) {
    if (why_.empty()) why_ = path + ": no memory for its staging buffers";
    close(fd_);
    fd_ = -1;
    return false;
  }
  return true;
}

uint8_t* SlotFileWriter::space(size_t* ret_bytes) {
  assert(fd_ >= 0);
  uint64_t filling = 0;
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return handed_over_ - written_ < staging_buffer_count; });
    filling = handed_over_;
  }
  Staging& s = staging_[filling % staging_buffer_count];
  *ret_bytes = staging_buffer_bytes - filling_bytes_;
  return s.bytes.get() + filling_bytes_;
}

bool SlotFileWriter::filled(size_t bytes) {
  filling_bytes_ += bytes;
  assert(filling_bytes_ <= staging_buffer_bytes);
  if (filling_bytes_ == staging_buffer_bytes) hand_over();
  std::lock_guard lock(mutex_);
  return !failed_;
}

std::string SlotFileWriter::why() const {
  std::lock_guard lock(mutex_);
  return why_;
}

void SlotFileWriter::hand_over() {
  std::lock_guard lock(mutex_);
  staging_[handed_over_ % staging_buffer_count].filled = filling_bytes_;
  ++handed_over_;
  filling_bytes_ = 0;
  changed_.notify_all();
}

bool SlotFileWriter::finish(uint64_t file_bytes) {
  assert(fd_ >= 0);
  if (filling_bytes_ > 0) hand_over();
  stop();
  std::lock_guard lock(mutex_);
  if (!failed_ && ftruncate(fd_, off_t(file_bytes)) != 0) {
    failed_ = true;
    why_ = path_ + ": " + std::strerror(errno);
  }
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0 && !failed_) {
    failed_ = true;
    why_ = path_ + ": " + std::strerror(errno);
  }
  return !failed_;
}

void SlotFileWriter::stop() {
  if (!writer_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
  }
  writer_.join();
}

void SlotFileWriter::write_staged() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return written_ < handed_over_ || stopping_; });
    if (written_ == handed_over_) return;  // stopping, and every buffer written
    const Staging& s = staging_[written_ % staging_buffer_count];
    // After a failure the rest is dropped: the caller learns of it and removes the file.
    bool ok = !failed_;
    lock.unlock();
    int error = 0;
    for (size_t done = 0; ok && done < s.filled;) {
      const ssize_t n = write(fd_, s.bytes.get() + done, s.filled - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = n < 0 ? errno : ENOSPC;
        ok = false;
      } else {
        done += size_t(n);
      }
    }
    lock.lock();
    if (error != 0 && !failed_) {
      failed_ = true;
      why_ = path_ + ": " + std::strerror(error);
    }
    ++written_;
    changed_.notify_all();
  }
}

}  // namespace kvpark::proxy
