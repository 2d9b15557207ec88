// kvparkctl's read verbs: status, stats, namespaces, list and show, printed for
// people (tables cut to a terminal, full width into a pipe) or as one JSON document
// of the schema shared with the HTTP status API (record.h). The same output
// whichever source (D-Bus or HTTP) the records came from.
#pragma once

#include <cstdint>

#include "ctl/source.h"

namespace kvpark::ctl {

struct ReadOptions {
  bool json = false;
  bool full = false;  // tables at full width on a terminal too
  EntryQuery query;   // list
};

// Each prints to stdout and returns the exit code (failure.h); failures throw as
// the source does.
int verb_status(ReadSource& source, const ReadOptions& o);
int verb_stats(ReadSource& source, const ReadOptions& o);
int verb_namespaces(ReadSource& source, const ReadOptions& o);
int verb_list(ReadSource& source, const ReadOptions& o);
int verb_show(ReadSource& source, const ReadOptions& o, uint64_t id);

}  // namespace kvpark::ctl
