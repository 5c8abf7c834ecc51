#include <gtest/gtest.h>

#include "quant/ggml_type.h"

TEST(GgmlType, KnownBlockSizes) {
  EXPECT_EQ(tandem::type_traits(tandem::GgmlType::Q4_K).block_bytes, 144u);
  EXPECT_EQ(tandem::type_traits(tandem::GgmlType::Q6_K).block_bytes, 210u);
  EXPECT_EQ(tandem::type_traits(tandem::GgmlType::Q8_0).block_bytes, 34u);
  EXPECT_FALSE(tandem::type_traits(4u).has_value());
}
