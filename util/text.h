// Text from outside (a tensor name, a path, bytes of a file) shown to a person: on a terminal, in
// an error message, in a log line. Nothing such text holds may move the cursor, recolour the
// screen, forge a line (docs/cli.md, "Names on the screen"), or run to a megabyte.
//
// ShowText escapes, byte for byte:
//   - control bytes (0x00-0x1f, 0x7f) and every byte that is not part of valid UTF-8 as \xNN;
//   - the backslash itself as \\ and the quote `quote` (when not 0) as \' or \", so that what is
//     shown reads back to exactly one text;
//   - C1 controls (U+0080-U+009F), the bidirectional controls that reorder a line (U+061C,
//     U+200E, U+200F, U+202A-U+202E, U+2066-U+2069), the line and paragraph separators (U+2028,
//     U+2029) and the invisible U+200B-U+200D, U+2060 and U+FEFF as \u{XXXX};
// and keeps every other valid UTF-8 sequence as it is (names in any script stay readable). At
// most `max_bytes` bytes of the escaped text are kept, never cutting an escape or a UTF-8
// sequence; a cut text ends in "..." and " (N bytes)", N the original's length.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ckpt {

inline constexpr size_t kMaxShownBytes = 200;

std::string ShowText(std::string_view text, size_t max_bytes = kMaxShownBytes, char quote = 0);

// A name in a message: 'ShowText(name)', quoted with single quotes.
std::string QuoteName(std::string_view name);

// A whole message that may carry text from outside not escaped where it was put together:
// control bytes and invalid UTF-8 as \xNN (a backslash is kept, so what ShowText escaped stays as
// it was), C1 and bidirectional controls as \u{XXXX}, at most max_bytes kept (cut as ShowText
// cuts). Used where a message leaves ckptdb: ckptdb_last_error() and the CLI's error lines.
std::string SafeMessage(std::string_view message, size_t max_bytes = 4096);

// JSON (RFC 8259, as a serializer wrote it, valid UTF-8) made safe for a terminal by the rule
// ShowText follows: DEL and every code point ShowText writes as \u{XXXX} (C1 controls, the
// bidirectional controls, the line and paragraph separators, the invisible ones) become the
// JSON escape \uXXXX, which a JSON reader turns back into the same code point. Nothing else
// changes: these code points occur only inside strings, so the document means what it meant.
std::string JsonForTerminal(std::string_view json);

}  // namespace ckpt
