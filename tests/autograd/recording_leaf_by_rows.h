#pragma once
// An autograd::LeafByRows for tests: serves a leaf's rows from a whole copy of
// its values, and takes its gradient in blocks of `block_rows` rows, adding each
// into a whole [rows, columns] tensor; it checks that the blocks come in row
// order, each begun once and ended before the next, and counts the reads.
#include <gtest/gtest.h>

#include "tp/autograd/tape.h"
#include "tp/ops/elementwise.h"

namespace tp::testing {

class RecordingLeafByRows : public autograd::LeafByRows {
 public:
  RecordingLeafByRows(const Tensor& values, int64_t block_rows)
      : whole(Tensor::zeros(values.shape())), values_(values.clone()), block_rows_(block_rows) {}
  int64_t block_rows() const override { return block_rows_; }
  Tensor weight_rows(int64_t row0, int64_t rows) override {
    EXPECT_LE(rows, block_rows_);
    ++reads;
    return values_.narrow(0, row0, rows).clone();
  }
  Tensor begin_grad_block(int64_t row0, int64_t rows) override {
    EXPECT_FALSE(block_.defined()) << "a block begun before the last one ended";
    EXPECT_EQ(row0, next_row_ % whole.size(0)) << "blocks out of row order";
    EXPECT_LE(rows, block_rows_);
    row0_ = row0;
    next_row_ = row0 + rows;
    block_ = Tensor::zeros({rows, whole.size(1)});
    return block_;
  }
  void end_grad_block() override {
    EXPECT_TRUE(block_.defined()) << "a block ended that was not begun";
    Tensor into = whole.narrow(0, row0_, block_.size(0));
    ops::add_(into, block_);
    block_ = Tensor();
    ++blocks;
  }

  Tensor whole;        // the sum of every gradient block delivered
  int64_t blocks = 0;  // gradient blocks delivered
  int64_t reads = 0;   // weight_rows calls

 private:
  Tensor values_;
  int64_t block_rows_, row0_ = 0, next_row_ = 0;
  Tensor block_;
};

}  // namespace tp::testing
