// kvparkd's command line: the embedded defaults, then the config file (config.h),
// then the flags, into DaemonOptions (options.h); --help and --print-config.
#pragma once

#include "daemon/options.h"

namespace kvpark::daemon {

// Parses argv over the config file over the embedded defaults. Returns true to
// run, or false with an exit code (0 after --help or --print-config, 2 on a bad
// flag or config file) through ret_exit with a message already printed.
bool parse_options(int argc, char** argv, DaemonOptions& ret_options, int& ret_exit);

}  // namespace kvpark::daemon
