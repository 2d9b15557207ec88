#include "proxy/options.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

#include "proto/version.h"

namespace kvpark::proxy {

const char* const version = KVPARK_VERSION;

namespace {

constexpr const char* usage_text =
    "usage: kvpark-proxy [--config FILE] [--listen HOST:PORT] [--upstream NAME=URL]...\n"
    "                    [--state NAME=SETTINGS]... [--slot-dir DIR] [--socket PATH]\n"
    "                    [--digest-cache DIR] [--no-system-candidate]\n"
    "                    [--park-as blocks|whole]\n"
    "                    [--keep-billing-header] [--version]\n"
    "OpenAI-compatible front for llama-server that parks slot state in kvparkd.\n"
    "See kvpark-proxy(1).\n";

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return std::string(s);
}

bool parse_listen(const std::string& text, ProxyOptions& o, std::string& ret_error) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    ret_error = "expected HOST:PORT, got '" + text + "'";
    return false;
  }
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const unsigned long port = std::strtoul(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port == 0 || port > 65535 || colon + 1 == text.size()) {
    ret_error = "bad port in '" + text + "'";
    return false;
  }
  o.listen_host = host;
  o.listen_port = uint16_t(port);
  return true;
}

UpstreamOptions* find_upstream(ProxyOptions& o, const std::string& name) {
  for (auto& u : o.upstreams)
    if (u.name == name) return &u;
  return nullptr;
}

// "NAME=VALUE" with a non-empty name.
bool split_named(const std::string& text, std::string& name, std::string& value,
                 std::string& ret_error) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    ret_error = "expected NAME=VALUE, got '" + text + "'";
    return false;
  }
  name = text.substr(0, eq);
  value = text.substr(eq + 1);
  return true;
}

bool set_value(ProxyOptions& o, const std::string& key, const std::string& value,
               std::string& ret_error) {
  if (key == "listen") return parse_listen(value, o, ret_error);
  if (key == "upstream") {
    std::string name, url;
    if (!split_named(value, name, url, ret_error)) return false;
    if (url.rfind("http://", 0) != 0) {
      ret_error = "upstream '" + name + "': URL must start with http://";
      return false;
    }
    while (url.size() > 7 && url.back() == '/') url.pop_back();
    for (const auto& u : o.upstreams) {
      if (u.url == url) {
        ret_error = "upstream " + url + " given twice";
        return false;
      }
    }
    // A name given again adds an upstream to that model (one model on several GPUs).
    const UpstreamOptions* same = find_upstream(o, name);
    o.upstreams.push_back(
        UpstreamOptions{.name = name, .url = url, .settings = same ? same->settings : ""});
    return true;
  }
  if (key == "state") {
    std::string name, settings;
    if (!split_named(value, name, settings, ret_error)) return false;
    if (find_upstream(o, name) == nullptr) {
      ret_error = "state for unknown upstream '" + name + "' (give the upstream first)";
      return false;
    }
    for (auto& u : o.upstreams)
      if (u.name == name) u.settings = settings;
    return true;
  }
  if (key == "slot_dir") {
    o.slot_dir = value;
    while (o.slot_dir.size() > 1 && o.slot_dir.back() == '/') o.slot_dir.pop_back();
    return true;
  }
  if (key == "socket") return o.socket_path = value, true;
  if (key == "digest_cache") return o.digest_cache = value, true;
  if (key == "system_candidate") {
    if (value == "true" || value == "yes" || value == "1") return o.system_candidate = true, true;
    if (value == "false" || value == "no" || value == "0") return o.system_candidate = false, true;
    ret_error = "expected true or false, got '" + value + "'";
    return false;
  }
  if (key == "park_as") {
    if (value == "blocks" || value == "whole") return o.park_blocks = value == "blocks", true;
    ret_error = "expected blocks or whole, got '" + value + "'";
    return false;
  }
  if (key == "normalize_billing_header") {
    if (value == "true" || value == "yes" || value == "1")
      return o.normalize_billing_header = true, true;
    if (value == "false" || value == "no" || value == "0")
      return o.normalize_billing_header = false, true;
    ret_error = "expected true or false, got '" + value + "'";
    return false;
  }
  ret_error = "unknown key '" + key + "'";
  return false;
}

bool repeatable(const std::string& key) { return key == "upstream" || key == "state"; }

// Keys set_value() knows, each also a flag taking a value (--slot-dir for slot_dir).
bool known_key(const std::string& key) {
  for (const char* k : {"listen", "upstream", "state", "slot_dir", "socket", "digest_cache",
                        "system_candidate", "normalize_billing_header", "park_as"}) {
    if (key == k) return true;
  }
  return false;
}

}  // namespace

ProxyOptions default_options() {
  ProxyOptions o;
  if (const char* d = std::getenv("RUNTIME_DIRECTORY"); d != nullptr && d[0] != '\0')
    o.slot_dir = d;  // systemd's RuntimeDirectory=, shared with llama-server's group
  else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x != nullptr && x[0] != '\0')
    o.slot_dir = std::string(x) + "/kvpark-proxy";
  else if (access("/dev/shm", W_OK) == 0)  // tmpfs: slot files are hundreds of MB
    o.slot_dir = "/dev/shm/kvpark-proxy-" + std::to_string(getuid());
  else
    o.slot_dir = "/tmp/kvpark-proxy-" + std::to_string(getuid());
  return o;
}

bool apply_config_text(const std::string& text, const std::string& path, ProxyOptions& o,
                       std::string& ret_error) {
  std::istringstream in(text);
  std::string line;
  std::set<std::string> seen;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    const size_t eq = t.find('=');
    const std::string where = path + ":" + std::to_string(number) + ": ";
    if (eq == std::string::npos) {
      ret_error = where + "expected key = value";
      return false;
    }
    const std::string key = trim(std::string_view(t).substr(0, eq));
    const std::string value = trim(std::string_view(t).substr(eq + 1));
    if (!repeatable(key) && !seen.insert(key).second) {
      ret_error = where + "'" + key + "' given twice";
      return false;
    }
    std::string error;
    if (!set_value(o, key, value, error)) {
      ret_error = where + error;
      return false;
    }
  }
  return true;
}

bool parse_command_line(int argc, char** argv, ProxyOptions& o, bool& ret_exit_now,
                        std::string& ret_error) {
  ret_exit_now = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(usage_text, stdout);
      ret_exit_now = true;
      return true;
    }
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("kvpark-proxy %s\n", kvpark::version);
      ret_exit_now = true;
      return true;
    }
  }
  // The file first, so flags override it.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config") != 0) continue;
    if (i + 1 >= argc) {
      ret_error = "--config: needs a value";
      return false;
    }
    o.config_path = argv[i + 1];
    std::ifstream file(o.config_path);
    if (!file) {
      ret_error = "--config: cannot read " + o.config_path;
      return false;
    }
    std::stringstream text;
    text << file.rdbuf();
    if (!apply_config_text(text.str(), o.config_path, o, ret_error)) return false;
  }
  std::set<std::string> seen;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--config") {
      ++i;
      continue;
    }
    if (flag == "--no-system-candidate") {
      o.system_candidate = false;
      continue;
    }
    if (flag == "--keep-billing-header") {
      o.normalize_billing_header = false;
      continue;
    }
    if (flag.rfind("--", 0) != 0) {
      ret_error = "unexpected argument '" + flag + "'\n" + usage_text;
      return false;
    }
    std::string key = flag.substr(2);
    for (char& c : key)
      if (c == '-') c = '_';
    if (!known_key(key)) {
      ret_error = "unknown option " + flag + " (see kvpark-proxy --help)";
      return false;
    }
    if (i + 1 >= argc) {
      ret_error = flag + ": needs a value";
      return false;
    }
    if (!repeatable(key) && !seen.insert(key).second) {
      ret_error = flag + ": given twice";
      return false;
    }
    std::string error;
    if (!set_value(o, key, argv[++i], error)) {
      ret_error = flag + ": " + error;
      return false;
    }
  }
  if (o.upstreams.empty()) {
    ret_error = "no upstream: give --upstream NAME=http://HOST:PORT (or upstream = ... in the file)";
    return false;
  }
  return true;
}

}  // namespace kvpark::proxy
