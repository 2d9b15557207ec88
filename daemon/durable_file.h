// Small state files the daemon keeps across restarts (runtime-overrides.conf, the
// disk tier's written-today): replaced whole, so a crash leaves the old contents or
// the new, never a mix.
#pragma once

#include <string>

namespace kvpark::daemon {

// Writes `text` to path.tmp, fsyncs it, renames it over `path` and fsyncs the
// directory. False with errno set when any step fails (path.tmp is removed).
bool replace_file_durably(const std::string& path, const std::string& text);

}  // namespace kvpark::daemon
