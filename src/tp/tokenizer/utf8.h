#pragma once
// UTF-8 helpers shared by the tokenizer stages. Invalid input is never passed
// through: `to_valid_utf8` replaces each maximal ill-formed subpart with U+FFFD,
// the rule of Unicode ch. 3 "U+FFFD substitution of maximal subparts", which is
// also what Python's bytes.decode(errors="replace"), Rust's from_utf8_lossy and
// JS TextDecoder do.
#include <cstdint>
#include <string>
#include <string_view>

namespace tp::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence starting at s[i], or 0 when s[i..] starts
// an ill-formed one; `bad_len` then gets the length of its maximal subpart (>= 1).
size_t valid_sequence_length(std::string_view s, size_t i, size_t* bad_len = nullptr);

bool is_valid(std::string_view s);

// s with every maximal ill-formed subpart replaced by U+FFFD.
std::string to_valid(std::string_view s);

// Decodes the (valid) code point at s[i] and advances i.
char32_t next(std::string_view s, size_t& i);

void append(std::string& out, char32_t cp);

// Length of a valid UTF-8 prefix of s that ends on a character boundary and
// leaves out a trailing incomplete (but so far well-formed) sequence.
size_t complete_prefix_length(std::string_view s);

}  // namespace tp::utf8
