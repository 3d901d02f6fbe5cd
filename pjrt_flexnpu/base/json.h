// A JSON string literal for the hand-built JSON of stats, telemetry, traces and the daemon.
#ifndef FLEXNPU_BASE_JSON_H_
#define FLEXNPU_BASE_JSON_H_

#include <cmath>
#include <cstdio>
#include <string>

namespace flexnpu {

// `s` quoted, with quotes, backslashes and control characters escaped.
inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// `v` with every digit (it reads back exactly); 0 when not finite (JSON has no such number).
inline std::string JsonNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", std::isfinite(v) ? v : 0.0);
  return buf;
}

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_JSON_H_
