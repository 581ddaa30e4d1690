#include "memento/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "memento/types.h"

namespace memento {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("x=" + std::to_string(x) + " is odd, expected even");
  return x / 2;
}

Status UsesMacros(int x, int* out) {
  MEMENTO_ASSIGN_OR_RETURN(int h, Half(x));
  MEMENTO_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST(StatusTest, OkAndError) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.ToString(), "OK");
  Status s = DataLossError("chunk 3 checksum mismatch");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.ToString(), "DataLoss: chunk 3 checksum mismatch");
  EXPECT_EQ(s.WithContext("slot 1").message(), "slot 1: chunk 3 checksum mismatch");
  EXPECT_TRUE(Status().WithContext("x").ok());
}

TEST(StatusTest, ErrnoMapping) {
  EXPECT_EQ(ErrnoError("open /x", ENOENT).code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoError("write", ENOSPC).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoError("connect", ECONNREFUSED).code(), StatusCode::kUnavailable);
  EXPECT_NE(ErrnoError("open /x", ENOENT).message().find("open /x: "), std::string::npos);
}

TEST(ResultTest, ValueAndError) {
  Result<int> r = Half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 4);
  Result<int> e = Half(3);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.value_or(-1), -1);
  int out = 0;
  EXPECT_TRUE(UsesMacros(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(UsesMacros(6, &out).code(), StatusCode::kInvalidArgument);
}

TEST(ResultTest, OkStatusWithoutValueIsInternal) {
  Result<int> r{Status()};
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> e = Half(3);
  EXPECT_DEATH((void)e.value(), "odd");
}

TEST(TypesTest, DTypes) {
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(*ParseDType("float32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("BF16"), DType::kBFloat16);
  EXPECT_FALSE(ParseDType("f33").ok());
  EXPECT_EQ(*ParseStateClass("dp_sharded"), StateClass::kDpSharded);
  EXPECT_FALSE(ParseStateClass("sharded").ok());
  TensorMeta m{"w", DType::kFloat16, {3, 4}, StateClass::kReplicated};
  EXPECT_EQ(m.numel(), 12);
  EXPECT_EQ(m.nbytes(), 24u);
  EXPECT_EQ(ShapeToString(m.shape), "[3, 4]");
}

}  // namespace
}  // namespace memento
