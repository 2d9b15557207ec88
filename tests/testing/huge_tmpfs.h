// A tmpfs mounted with huge=within_size in a directory of its own, as the shipped unit
// mounts one for kvparkd's kept_memory_dir: 2 MiB pages for its files whatever the
// kernel's shmem_enabled says. Mounting needs root: tests that need one skip without it.
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kvpark::testing {

class HugeTmpfs {
 public:
  HugeTmpfs() {
    char templ[] = "/tmp/kvpark-huge-tmpfs-XXXXXX";
    if (mkdtemp(templ) == nullptr) {
      why_not_ = std::string("no directory for a tmpfs: ") + std::strerror(errno);
      return;
    }
    if (mount("tmpfs", templ, "tmpfs", 0, "huge=within_size,mode=0700") != 0) {
      why_not_ = std::string("cannot mount a tmpfs with huge=within_size (needs root): ") +
                 std::strerror(errno);
      rmdir(templ);
      return;
    }
    path_ = templ;
  }
  ~HugeTmpfs() {
    if (path_.empty()) return;
    // Detached: files a test still holds open (a kept fd) keep it alive until closed.
    umount2(path_.c_str(), MNT_DETACH);
    rmdir(path_.c_str());
  }
  HugeTmpfs(const HugeTmpfs&) = delete;
  HugeTmpfs& operator=(const HugeTmpfs&) = delete;

  bool mounted() const { return !path_.empty(); }
  // Whether `fd` is a file of this tmpfs with no name (O_TMPFILE), not a memfd.
  ::testing::AssertionResult holds_unnamed(int fd) const {
    struct stat file {};
    struct stat directory {};
    if (fstat(fd, &file) != 0 || stat(path_.c_str(), &directory) != 0)
      return ::testing::AssertionFailure() << "stat: " << std::strerror(errno);
    if (file.st_dev != directory.st_dev)
      return ::testing::AssertionFailure() << "fd " << fd << " is not a file of " << path_;
    if (file.st_nlink != 0) return ::testing::AssertionFailure() << "fd " << fd << " has a name";
    return ::testing::AssertionSuccess();
  }
  const std::string& path() const { return path_; }
  const std::string& why_not() const { return why_not_; }

 private:
  std::string path_;
  std::string why_not_;
};

}  // namespace kvpark::testing
