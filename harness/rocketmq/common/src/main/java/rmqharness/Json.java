package rmqharness;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Collection;
import java.util.Map;

/** A tiny JSON writer: the output format must not depend on which fastjson a broker line ships. */
final class Json {
  private Json() {}

  static String write(Object value) {
    StringBuilder out = new StringBuilder();
    append(out, value);
    return out.toString();
  }

  private static void append(StringBuilder out, Object value) {
    if (value == null) {
      out.append("null");
    } else if (value instanceof String s) {
      quote(out, s);
    } else if (value instanceof Number || value instanceof Boolean) {
      out.append(value);
    } else if (value instanceof Map<?, ?> map) {
      out.append('{');
      boolean first = true;
      for (Map.Entry<?, ?> e : map.entrySet()) {
        if (!first) out.append(", ");
        first = false;
        quote(out, String.valueOf(e.getKey()));
        out.append(": ");
        append(out, e.getValue());
      }
      out.append('}');
    } else if (value instanceof Collection<?> list) {
      out.append('[');
      boolean first = true;
      for (Object item : list) {
        if (!first) out.append(", ");
        first = false;
        append(out, item);
      }
      out.append(']');
    } else {
      quote(out, value.toString());
    }
  }

  private static void quote(StringBuilder out, String s) {
    out.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> out.append("\\\"");
        case '\\' -> out.append("\\\\");
        case '\n' -> out.append("\\n");
        case '\r' -> out.append("\\r");
        case '\t' -> out.append("\\t");
        default -> {
          if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
          else out.append(c);
        }
      }
    }
    out.append('"');
  }

  /** One JSON object per line, flushed at once so a failed run still leaves what it saw. */
  static final class Lines implements AutoCloseable {
    private final BufferedWriter writer;
    private int count;

    Lines(Path path) throws IOException {
      this.writer = Files.newBufferedWriter(path, StandardCharsets.UTF_8);
    }

    synchronized void write(Map<String, Object> row) {
      try {
        writer.write(Json.write(row));
        writer.write('\n');
        writer.flush();
        count++;
      } catch (IOException e) {
        throw new IllegalStateException("cannot write a JSON line: " + e.getMessage(), e);
      }
    }

    synchronized int count() {
      return count;
    }

    @Override
    public synchronized void close() throws IOException {
      writer.close();
    }
  }
}
