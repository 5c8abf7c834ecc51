#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

const std::string kShared = TANDEM_SHARED_DIR "/models";

// One tensor line of reference/stories260K.gguf.metadata.txt:
//   "  blk.0.attn_q.weight   F32   [64, 64] off=262400"
struct RefTensor {
  std::string name;
  std::vector<int64_t> dims;
  uint64_t offset;
};

std::vector<RefTensor> read_reference_tensors(std::string* header, uint64_t* data_start,
                                              uint64_t* file_size) {
  std::ifstream in(kShared + "/reference/stories260K.gguf.metadata.txt");
  EXPECT_TRUE(in.good());
  std::vector<RefTensor> out;
  std::string line;
  std::getline(in, *header);
  while (std::getline(in, line)) {
    if (line.rfind("data_start ", 0) == 0) {
      std::sscanf(line.c_str(), "data_start %lu file_size %lu", data_start, file_size);
      continue;
    }
    const auto lb = line.find('['), rb = line.find(']'), off = line.find("off=");
    if (lb == std::string::npos || off == std::string::npos || line.find(" F32 ") == std::string::npos)
      continue;
    RefTensor t;
    std::istringstream ns(line);
    ns >> t.name;
    std::string dims = line.substr(lb + 1, rb - lb - 1);
    std::istringstream ds(dims);
    std::string tok;
    while (std::getline(ds, tok, ',')) t.dims.push_back(std::stoll(tok));
    t.offset = std::stoull(line.substr(off + 4));
    out.push_back(t);
  }
  return out;
}

}  // namespace

TEST(GgufReader, Stories260KMatchesReferenceDump) {
  auto f = GgufFile::open(kShared + "/gguf/stories260K.gguf");
  std::string header;
  uint64_t data_start = 0, file_size = 0;
  auto ref = read_reference_tensors(&header, &data_start, &file_size);
  ASSERT_EQ(header, "magic b'GGUF' version 3 tensors 48 kv 19");

  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), data_start);
  EXPECT_EQ(f->data_offset(), 14176u);
  EXPECT_EQ(f->file_size(), file_size);
  EXPECT_EQ(f->metadata().size(), 19u);

  // KVs in file order, with the types the reference dump shows.
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"tokenizer.ggml.tokens", "arr"}, {"tokenizer.ggml.scores", "arr"},
      {"tokenizer.ggml.token_type", "arr"}, {"tokenizer.ggml.model", "str"},
      {"general.architecture", "str"}, {"general.name", "str"},
      {"tokenizer.ggml.unknown_token_id", "u32"}, {"tokenizer.ggml.bos_token_id", "u32"},
      {"tokenizer.ggml.eos_token_id", "u32"}, {"tokenizer.ggml.seperator_token_id", "u32"},
      {"tokenizer.ggml.padding_token_id", "u32"}, {"llama.context_length", "u32"},
      {"llama.embedding_length", "u32"}, {"llama.feed_forward_length", "u32"},
      {"llama.attention.head_count", "u32"}, {"llama.attention.head_count_kv", "u32"},
      {"llama.block_count", "u32"}, {"llama.rope.dimension_count", "u32"},
      {"llama.attention.layer_norm_rms_epsilon", "f32"}};
  ASSERT_EQ(f->metadata().size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(f->metadata()[i].key, keys[i].first);
    EXPECT_EQ(gguf_type_name(f->metadata()[i].value.type), keys[i].second) << keys[i].first;
  }

  auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens);
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[0], "<unk>");
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  EXPECT_EQ((*tokens)[510], "~");
  EXPECT_EQ((*tokens)[511], "\xe2\x80\x8a");  // U+200A
  auto scores = f->get_float_array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores);
  EXPECT_EQ(scores->size(), 512u);
  EXPECT_EQ((*scores)[0], 0.0f);
  EXPECT_EQ((*scores)[511], -252.0f);
  auto types = f->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types);
  EXPECT_EQ((*types)[0], 2);
  EXPECT_EQ((*types)[1], 3);
  EXPECT_EQ((*types)[3], 6);
  EXPECT_EQ((*types)[511], 1);

  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_int("llama.context_length"), 2048);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(f->get_int("llama.block_count"), 5);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), 8);
  EXPECT_EQ(f->get_int("tokenizer.ggml.seperator_token_id"), 4294967295);
  EXPECT_FLOAT_EQ(*f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_FALSE(f->get_int("llama.rope.freq_base").has_value());

  ASSERT_EQ(ref.size(), 48u);
  ASSERT_EQ(f->tensors().size(), 48u);
  for (size_t i = 0; i < ref.size(); ++i) {
    const GgufTensor& t = f->tensors()[i];
    EXPECT_EQ(t.name, ref[i].name);
    EXPECT_EQ(t.type, GgmlType::F32);
    EXPECT_EQ(t.dims, ref[i].dims) << t.name;
    EXPECT_EQ(t.offset, ref[i].offset) << t.name;
    int64_t n = 1;
    for (auto d : ref[i].dims) n *= d;
    EXPECT_EQ(t.n_elements, n);
    EXPECT_EQ(t.n_bytes, static_cast<uint64_t>(n) * 4);
    EXPECT_EQ(static_cast<uint64_t>(t.data - f->tensors()[0].data), t.offset) << t.name;
  }
  const GgufTensor* q = f->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->rows(), 64);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);

  // The data pointer is base + data offset + tensor offset: compare with a plain read.
  std::ifstream raw(kShared + "/gguf/stories260K.gguf", std::ios::binary);
  raw.seekg(static_cast<std::streamoff>(f->data_offset() + q->offset));
  std::vector<char> bytes(q->n_bytes);
  raw.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_EQ(std::memcmp(bytes.data(), q->data, bytes.size()), 0);
}

TEST(GgufReader, TypedGettersRejectWrongTypes) {
  auto f = GgufFile::open(kShared + "/gguf/stories260K.gguf");
  try {
    f->get_int("general.architecture");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
    EXPECT_NE(std::string(e.what()).find("general.architecture"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("str"), std::string::npos);
  }
  EXPECT_THROW(f->get_string("llama.block_count"), Error);
  EXPECT_THROW(f->get_bool("llama.block_count"), Error);
  EXPECT_THROW(f->get_float("general.name"), Error);
  EXPECT_THROW(f->get_string_array("tokenizer.ggml.scores"), Error);
  EXPECT_THROW(f->get_float_array("tokenizer.ggml.tokens"), Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.scores"), Error);
  EXPECT_EQ(f->get_float("llama.block_count"), 5.0);  // integers widen to float
}

// The lines of /proc/self/smaps that describe the mapping of `path` and
// start with `field` (e.g. "VmFlags:", "Rss:").
std::vector<std::string> mapping_fields(const std::string& path, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  std::vector<std::string> out;
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    // A mapping's line starts "start-end "; its fields' names have no '-'.
    const bool header = !line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
                        line.substr(0, line.find(' ')).find('-') != std::string::npos;
    if (header) in_mapping = line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
    if (in_mapping && line.rfind(field, 0) == 0) out.push_back(line);
  }
  return out;
}

// The mapping refuses 2 MiB mappings (VmFlags "nh"): a file in large page
// cache folios would otherwise keep megabytes around each small tensor read
// from it resident (GgufFile::open).
TEST(GgufReader, MappingAsksForSmallPages) {
  const std::string path = fs::canonical(kShared + "/gguf/stories260K.gguf").string();
  auto f = GgufFile::open(path);
  const std::vector<std::string> flags = mapping_fields(path, "VmFlags:");
  ASSERT_FALSE(flags.empty()) << "no mapping of " << path << " in /proc/self/smaps";
  for (const std::string& line : flags) EXPECT_NE((line + " ").find(" nh "), std::string::npos) << line;
}

// copy_out reads the bytes from the file: none of the mapping's pages becomes
// resident (embedding lookups, Model::forward), and the bytes are the mapped ones.
TEST(GgufReader, CopyOutLeavesTheMappingAlone) {
  const std::string path = fs::canonical(kShared + "/gguf/stories260K.gguf").string();
  auto f = GgufFile::open(path);
  const GgufTensor* t = f->find_tensor("token_embd.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_GT(t->n_bytes, 3 * 4096u);
  auto resident_kb = [&] {
    int64_t kb = 0;
    for (const std::string& line : mapping_fields(path, "Rss:")) kb += std::stoll(line.substr(4));
    return kb;
  };
  f->release_all_pages();
  ASSERT_EQ(resident_kb(), 0);
  const size_t n = 5000;  // across a page boundary
  const uint8_t* p = t->data + 4096 - 100;
  std::vector<uint8_t> got(n);
  f->copy_out(p, n, got.data());
  EXPECT_EQ(resident_kb(), 0);
  EXPECT_EQ(std::memcmp(got.data(), p, n), 0);  // faults the pages in: last
  EXPECT_GT(resident_kb(), 0);
  EXPECT_THROW(f->copy_out(p, static_cast<size_t>(f->file_size()), got.data()), Error);
}

TEST(GgufReader, VocabOnlyFile) {
  auto f = GgufFile::open(kShared + "/vocab/ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens);
  EXPECT_EQ(tokens->size(), 32000u);
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores")->size(), 32000u);
}

// Flat arrays are kept as the file's bytes (a 262k-entry vocabulary took
// 38 MB as one GgufValue per element) and decode to the same elements.
TEST(GgufReader, FlatArraysArePackedAndDecodeInOrder) {
  auto f = GgufFile::open(kShared + "/vocab/ggml-vocab-llama-spm.gguf");
  const GgufValue* tokens = f->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  const auto* packed = std::get_if<GgufPackedArray>(&tokens->v);
  ASSERT_NE(packed, nullptr);
  EXPECT_EQ(packed->n, 32000u);
  EXPECT_LT(packed->bytes.size(), 32000u * 24);  // u64 length + a short text each
  EXPECT_EQ(tokens->array_size(), 32000u);
  const std::vector<GgufValue> head = tokens->array_elements(3);
  ASSERT_EQ(head.size(), 3u);
  EXPECT_EQ(std::get<std::string>(head[0].v), "<unk>");
  EXPECT_EQ(std::get<std::string>(head[1].v), "<s>");
  EXPECT_EQ(std::get<std::string>(head[2].v), "</s>");
  const auto all = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(all);
  size_t i = 0;
  tokens->for_each_element([&](GgufValue&& e) {
    EXPECT_EQ(e.type, GgufType::STRING);
    EXPECT_EQ(std::get<std::string>(e.v), (*all)[i]);
    return ++i < 100;  // stops when told
  });
  EXPECT_EQ(i, 100u);
  const auto types = f->get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types);
  EXPECT_EQ((*types)[0], 2);  // <unk>: UNKNOWN
  EXPECT_EQ((*types)[1], 3);  // <s>: CONTROL
  EXPECT_EQ(f->find("tokenizer.ggml.scores")->to_display(2), "[0, 0, ... (32000 elements)]");
}

// A packed array views the file's mapping; a writer given one keeps a copy,
// so it can write after the file is closed (tandem synth copies a vocabulary
// this way), and the pages the tokenizer read can be given back.
TEST(GgufReader, PackedArraysOutliveTheirFileInAWriter) {
  const std::string path = kShared + "/vocab/ggml-vocab-llama-spm.gguf";
  GgufWriter w;
  std::vector<std::string> tokens;
  {
    auto f = GgufFile::open(path);
    tokens = *f->get_string_array("tokenizer.ggml.tokens");
    ASSERT_NE(std::get_if<GgufPackedArray>(&f->find("tokenizer.ggml.tokens")->v), nullptr);
    w.add("tokenizer.ggml.tokens", *f->find("tokenizer.ggml.tokens"));
    w.add("tokenizer.ggml.scores", *f->find("tokenizer.ggml.scores"));
    f->release_metadata_pages();
    EXPECT_EQ(*f->get_string_array("tokenizer.ggml.tokens"), tokens);  // read again from the page cache
  }
  const std::vector<uint8_t> bytes = w.to_bytes();
  auto g = GgufFile::from_memory(bytes.data(), bytes.size());
  EXPECT_EQ(*g->get_string_array("tokenizer.ggml.tokens"), tokens);
  EXPECT_EQ(g->get_float_array("tokenizer.ggml.scores")->size(), tokens.size());
  size_t n = 0;
  EXPECT_TRUE(g->for_each_string("tokenizer.ggml.tokens", [&](std::string_view t) { EXPECT_EQ(t, tokens[n++]); }));
  EXPECT_EQ(n, tokens.size());
  EXPECT_FALSE(g->for_each_string("tokenizer.ggml.merges", [](std::string_view) {}));
  EXPECT_THROW(g->for_each_string("tokenizer.ggml.scores", [](std::string_view) {}), Error);
}

TEST(GgufReader, MissingFileIsIoError) {
  try {
    GgufFile::open("/nonexistent/dir/model.gguf");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.gguf"), std::string::npos);
  }
}
