// Replacing a small file durably (see durable_file.h).
#include "daemon/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace kvpark::daemon {

bool replace_file_durably(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return false;
  const bool written =
      ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!written || std::rename(temp.c_str(), path.c_str()) != 0) {
    const int failure = written ? errno : err;
    unlink(temp.c_str());
    errno = failure;
    return false;
  }
  const std::string directory = std::filesystem::path(path).parent_path().string();
  const int dir = ::open(directory.empty() ? "." : directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  const bool synced = fsync(dir) == 0;
  const int sync_err = errno;
  ::close(dir);
  errno = sync_err;
  return synced;
}

}  // namespace kvpark::daemon
