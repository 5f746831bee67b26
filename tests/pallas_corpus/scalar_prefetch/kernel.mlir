module attributes {stable_mosaic.version = 15 : i64} {
  func.func @body(%arg0: i32, %arg1: memref<8xi32, #tpu.memory_space<smem>>, %arg2: memref<8xi32, #tpu.memory_space<smem>>, %arg3: memref<16x128xbf16, #tpu.memory_space<vmem>>, %arg4: memref<16x128xf32, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<parallel>], iteration_bounds = array<i64: 8>, scalar_prefetch = 2 : i64, scratch_operands = 0 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{transform_indices = @transform_0, window_bounds = array<i64: 16, 128>}, {transform_indices = @transform_1, window_bounds = array<i64: 16, 128>}]} {
    %c0 = arith.constant 0 : index
    %c0_0 = arith.constant 0 : index
    %0 = vector.load %arg3[%c0, %c0_0] : memref<16x128xbf16, #tpu.memory_space<vmem>>, vector<16x128xbf16>
    %1 = arith.index_cast %arg0 : i32 to index
    %2 = memref.load %arg2[%1] : memref<8xi32, #tpu.memory_space<smem>>
    %3 = arith.sitofp %2 : i32 to f32
    %4 = arith.extf %0 : vector<16x128xbf16> to vector<16x128xf32>
    %5 = vector.broadcast %3 : f32 to vector<16x128xf32>
    %6 = arith.mulf %4, %5 : vector<16x128xf32>
    %c0_1 = arith.constant 0 : index
    %c0_2 = arith.constant 0 : index
    %7 = vector.load %arg4[%c0_1, %c0_2] : memref<16x128xf32, #tpu.memory_space<vmem>>, vector<16x128xf32>
    tpu.vector_store %arg4[%c0_1, %c0_2], %6 {strides = array<i32>} : memref<16x128xf32, #tpu.memory_space<vmem>>, vector<16x128xf32>, 
    return
  }
  func.func @transform_0(%arg0: i32, %arg1: memref<8xi32, #tpu.memory_space<smem>>, %arg2: memref<8xi32, #tpu.memory_space<smem>>) -> (i32, i32) {
    %0 = arith.index_cast %arg0 : i32 to index
    %1 = memref.load %arg1[%0] : memref<8xi32, #tpu.memory_space<smem>>
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %1, %c0_i32 : i32, i32
  }
  func.func @transform_1(%arg0: i32, %arg1: memref<8xi32, #tpu.memory_space<smem>>, %arg2: memref<8xi32, #tpu.memory_space<smem>>) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %c0_i32 : i32, i32
  }
}
