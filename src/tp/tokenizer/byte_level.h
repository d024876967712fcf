#pragma once
// GPT-2's byte-to-unicode table: every byte becomes one printable character
// (printable Latin-1 bytes map to themselves, the other 68 to U+0100..U+0143),
// so byte-level BPE vocabularies are plain strings.
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace tp::byte_level {

// UTF-8 of the character standing for each byte.
const std::array<std::string, 256>& byte_to_chars();

// The byte a code point stands for, or nullopt when it is not in the table.
std::optional<unsigned char> char_to_byte(char32_t cp);

// Maps every byte of `s` to its character.
std::string encode(std::string_view s);
// The same into `out` (cleared first), reusing its capacity.
void encode_into(std::string_view s, std::string& out);

// Inverse of encode for a token; a token containing any character outside the
// table is returned as its own UTF-8 bytes (what Hugging Face's decoder does
// for added tokens such as "<｜begin▁of▁sentence｜>").
void decode_token(std::string_view token, std::string& bytes);

}  // namespace tp::byte_level
