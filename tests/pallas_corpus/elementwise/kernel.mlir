module attributes {stable_mosaic.version = 15 : i64} {
  func.func @body(%arg0: i32, %arg1: i32, %arg2: memref<64x128xf32, #tpu.memory_space<vmem>>, %arg3: memref<64x128xf32, #tpu.memory_space<vmem>>, %arg4: memref<64x128xf32, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<parallel>], iteration_bounds = array<i64: 2, 2>, scalar_prefetch = 0 : i64, scratch_operands = 0 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{transform_indices = @transform_0, window_bounds = array<i64: 64, 128>}, {transform_indices = @transform_1, window_bounds = array<i64: 64, 128>}, {transform_indices = @transform_2, window_bounds = array<i64: 64, 128>}]} {
    %c0 = arith.constant 0 : index
    %c0_0 = arith.constant 0 : index
    %0 = vector.load %arg2[%c0, %c0_0] : memref<64x128xf32, #tpu.memory_space<vmem>>, vector<64x128xf32>
    %c0_1 = arith.constant 0 : index
    %c0_2 = arith.constant 0 : index
    %1 = vector.load %arg3[%c0_1, %c0_2] : memref<64x128xf32, #tpu.memory_space<vmem>>, vector<64x128xf32>
    %2 = arith.mulf %0, %1 : vector<64x128xf32>
    %3 = math.exp %0 : vector<64x128xf32>
    %4 = arith.addf %2, %3 : vector<64x128xf32>
    %c0_3 = arith.constant 0 : index
    %c0_4 = arith.constant 0 : index
    %5 = vector.load %arg4[%c0_3, %c0_4] : memref<64x128xf32, #tpu.memory_space<vmem>>, vector<64x128xf32>
    tpu.vector_store %arg4[%c0_3, %c0_4], %4 {strides = array<i32>} : memref<64x128xf32, #tpu.memory_space<vmem>>, vector<64x128xf32>, 
    return
  }
  func.func @transform_0(%arg0: i32, %arg1: i32) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    return %arg0, %arg1 : i32, i32
  }
  func.func @transform_1(%arg0: i32, %arg1: i32) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    return %arg0, %arg1 : i32, i32
  }
  func.func @transform_2(%arg0: i32, %arg1: i32) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    return %arg0, %arg1 : i32, i32
  }
}
