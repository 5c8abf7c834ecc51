// Checks a Tokenizer against a reference file written by
// scripts/gen_tokenizer_refs.py (llama.cpp's own tokenize / detokenize /
// token_to_piece / is_eog output for one vocabulary).
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace tandem::testing_tok {

inline std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

inline nlohmann::json load_reference(const std::string& name) {
  const std::string path = std::string(TANDEM_TESTDATA_DIR) + "/tokenizer/" + name;
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

inline void expect_metadata(const Tokenizer& tok, const nlohmann::json& r) {
  EXPECT_EQ(tok.n_vocab(), r["n_vocab"].get<int32_t>());
  EXPECT_EQ(tok.bos_id(), r["bos"].get<int32_t>());
  EXPECT_EQ(tok.eos_id(), r["eos"].get<int32_t>());
  EXPECT_EQ(tok.add_bos(), r["add_bos"].get<bool>());
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.is_eog(id)) eog.push_back(id);
  }
  EXPECT_EQ(eog, r["eog"].get<std::vector<int32_t>>());
}

// Returns the number of (text, flags) encodings compared.
inline size_t expect_cases(const Tokenizer& tok, const nlohmann::json& r) {
  size_t checked = 0;
  for (const auto& c : r["cases"]) {
    const std::string text = unhex(c["hex"].get<std::string>());
    for (const auto& e : c["encodings"]) {
      const bool add_special = e["add_special"].get<bool>();
      const bool parse_special = e["parse_special"].get<bool>();
      const auto want = e["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(tok.encode(text, add_special, parse_special), want)
          << "text '" << text << "' add_special=" << add_special << " parse_special=" << parse_special;
      EXPECT_EQ(tok.decode(want), unhex(e["decode_hex"].get<std::string>())) << "text '" << text << "'";
      EXPECT_EQ(tok.decode(want, true), unhex(e["decode_special_hex"].get<std::string>()))
          << "text '" << text << "'";
      ++checked;
    }
  }
  return checked;
}

inline void expect_pieces(const Tokenizer& tok, const nlohmann::json& r) {
  for (const auto& p : r["pieces"]) {
    const int32_t id = p["id"].get<int32_t>();
    EXPECT_EQ(tok.token_to_piece(id), unhex(p["hex"].get<std::string>())) << "id " << id;
    EXPECT_EQ(tok.token_to_piece(id, true), unhex(p["special_hex"].get<std::string>())) << "id " << id;
  }
}

}  // namespace tandem::testing_tok
