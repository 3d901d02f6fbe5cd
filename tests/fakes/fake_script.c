#include "fake_script.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kMaxScript = 1 << 16 };

static size_t load(const fake_script* s, char* buf, size_t len) {
  const char* path = getenv(s->file_env);
  size_t n = 0;
  if (path != NULL && path[0] != '\0') {
    FILE* f = fopen(path, "r");
    if (f != NULL) {
      n = fread(buf, 1, len - 1, f);
      fclose(f);
    }
  } else {
    const char* text = getenv(s->inline_env);
    if (text != NULL) {
      n = strlen(text);
      if (n > len - 1) n = len - 1;
      memcpy(buf, text, n);
    }
  }
  buf[n] = '\0';
  return n;
}

static int lookup(const char* script, const char* wanted, char* out, size_t out_len) {
  const char* p = script;
  int found = 0;
  while (*p != '\0') {
    const char* end = p + strcspn(p, ";\n");
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    const char* eq = memchr(p, '=', (size_t)(end - p));
    if (eq != NULL && *p != '#') {
      const char* key_end = eq;
      while (key_end > p && (key_end[-1] == ' ' || key_end[-1] == '\t')) --key_end;
      if ((size_t)(key_end - p) == strlen(wanted) && strncmp(p, wanted, strlen(wanted)) == 0) {
        const char* v = eq + 1;
        const char* v_end = end;
        while (v < v_end && (*v == ' ' || *v == '\t')) ++v;
        while (v_end > v && (v_end[-1] == ' ' || v_end[-1] == '\t' || v_end[-1] == '\r')) --v_end;
        size_t n = (size_t)(v_end - v);
        if (n > out_len - 1) n = out_len - 1;
        memcpy(out, v, n);
        out[n] = '\0';
        found = 1; /* the last entry wins */
      }
    }
    p = *end != '\0' ? end + 1 : end;
  }
  return found;
}

int fake_string(const fake_script* s, const char* key, int device, char* out, size_t out_len) {
  static __thread char script[kMaxScript];
  load(s, script, sizeof(script));
  if (device >= 0) {
    char specific[128];
    snprintf(specific, sizeof(specific), "%s.%d", key, device);
    if (lookup(script, specific, out, out_len)) return 1;
  }
  return lookup(script, key, out, out_len);
}

long long fake_int(const fake_script* s, const char* key, int device, long long fallback) {
  char value[64];
  if (!fake_string(s, key, device, value, sizeof(value)) || value[0] == '\0') return fallback;
  return strtoll(value, NULL, 0);
}
