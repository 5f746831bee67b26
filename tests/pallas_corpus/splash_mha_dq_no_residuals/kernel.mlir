module attributes {stable_mosaic.version = 15 : i64} {
  func.func @splash_mha_dq_no_residuals(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg5: memref<1x128x128xbf16, #tpu.memory_space<vmem>>, %arg6: memref<1x256x128xbf16, #tpu.memory_space<vmem>>, %arg7: memref<1x256x128xbf16, #tpu.memory_space<vmem>>, %arg8: memref<1x1x128xf32, #tpu.memory_space<vmem>>, %arg9: memref<1x128x128xbf16, #tpu.memory_space<vmem>>, %arg10: memref<1x1x128xf32, #tpu.memory_space<vmem>>, %arg11: memref<128x128xi32, #tpu.memory_space<vmem>>, %arg12: memref<128x128xf32, #tpu.memory_space<vmem>>, %arg13: memref<1x128x128xbf16, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<arbitrary>, #tpu.dimension_semantics<arbitrary>, #tpu.dimension_semantics<arbitrary>], iteration_bounds = array<i64: 2, 2, 1>, scalar_prefetch = 2 : i64, scratch_operands = 0 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{transform_indices = @transform_0, window_bounds = array<i64: 1, 128, 128>}, {transform_indices = @transform_1, window_bounds = array<i64: 1, 256, 128>}, {transform_indices = @transform_2, window_bounds = array<i64: 1, 256, 128>}, {transform_indices = @transform_3, window_bounds = array<i64: 1, 1, 128>}, {transform_indices = @transform_4, window_bounds = array<i64: 1, 128, 128>}, {transform_indices = @transform_5, window_bounds = array<i64: 1, 1, 128>}, {transform_indices = @transform_6, window_bounds = array<i64: 128, 128>}, {pipeline_mode = #tpu.pipeline_mode<synchronous>, transform_indices = @transform_7, window_bounds = array<i64: 128, 128>}, {transform_indices = @transform_8, window_bounds = array<i64: 1, 128, 128>}]} {
    %c0_i32 = arith.constant 0 : i32
    %0 = arith.cmpi eq, %arg2, %c0_i32 : i32
    %1 = arith.extui %0 : i1 to i32
    %c0_i32_0 = arith.constant 0 : i32
    %2 = arith.cmpi ne, %1, %c0_i32_0 : i32
    scf.if %2 {
      %cst = arith.constant 0.000000e+00 : f32
      %17 = vector.broadcast %cst : f32 to vector<128x128xf32>
      %c0_6 = arith.constant 0 : index
      %c0_7 = arith.constant 0 : index
      %18 = vector.load %arg12[%c0_6, %c0_7] : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>
      tpu.vector_store %arg12[%c0_6, %c0_7], %17 {strides = array<i32>} : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>, 
    } else {
    }
    %c0 = arith.constant 0 : index
    %3 = arith.index_cast %arg1 : i32 to index
    %4 = arith.index_cast %arg2 : i32 to index
    %5 = memref.load %arg4[%c0, %3, %4] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %6 = arith.extsi %5 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %7 = arith.cmpi sgt, %6, %c0_i32_1 : i32
    %c0_2 = arith.constant 0 : index
    %8 = arith.index_cast %arg1 : i32 to index
    %9 = arith.index_cast %arg2 : i32 to index
    %10 = memref.load %arg3[%c0_2, %8, %9] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %11 = arith.extsi %10 : i8 to i32
    %12 = arith.extui %7 : i1 to i32
    %c0_i32_3 = arith.constant 0 : i32
    %13 = arith.cmpi ne, %12, %c0_i32_3 : i32
    scf.if %13 {
      %c0_6 = arith.constant 0 : index
      %c0_7 = arith.constant 0 : index
      %c0_8 = arith.constant 0 : index
      %17 = vector.load %arg5[%c0_6, %c0_7, %c0_8] : memref<1x128x128xbf16, #tpu.memory_space<vmem>>, vector<1x128x128xbf16>
      %18 = vector.shape_cast %17 : vector<1x128x128xbf16> to vector<128x128xbf16>
      %c0_9 = arith.constant 0 : index
      %c0_10 = arith.constant 0 : index
      %c0_11 = arith.constant 0 : index
      %19 = vector.load %arg6[%c0_9, %c0_10, %c0_11] : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>
      %20 = vector.shape_cast %19 : vector<1x256x128xbf16> to vector<256x128xbf16>
      %c0_12 = arith.constant 0 : index
      %c0_13 = arith.constant 0 : index
      %c0_14 = arith.constant 0 : index
      %21 = vector.load %arg7[%c0_12, %c0_13, %c0_14] : memref<1x256x128xbf16, #tpu.memory_space<vmem>>, vector<1x256x128xbf16>
      %22 = vector.shape_cast %21 : vector<1x256x128xbf16> to vector<256x128xbf16>
      %c0_15 = arith.constant 0 : index
      %c0_16 = arith.constant 0 : index
      %c0_17 = arith.constant 0 : index
      %23 = vector.load %arg8[%c0_15, %c0_16, %c0_17] : memref<1x1x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128xf32>
      %24 = vector.shape_cast %23 : vector<1x1x128xf32> to vector<128xf32>
      %25 = vector.shape_cast %24 : vector<128xf32> to vector<128x1xf32>
      %c0_18 = arith.constant 0 : index
      %c0_19 = arith.constant 0 : index
      %c0_20 = arith.constant 0 : index
      %26 = vector.load %arg9[%c0_18, %c0_19, %c0_20] : memref<1x128x128xbf16, #tpu.memory_space<vmem>>, vector<1x128x128xbf16>
      %27 = vector.shape_cast %26 : vector<1x128x128xbf16> to vector<128x128xbf16>
      %c0_21 = arith.constant 0 : index
      %c0_22 = arith.constant 0 : index
      %c0_23 = arith.constant 0 : index
      %28 = vector.load %arg10[%c0_21, %c0_22, %c0_23] : memref<1x1x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128xf32>
      %29 = vector.shape_cast %28 : vector<1x1x128xf32> to vector<128xf32>
      %30 = vector.shape_cast %29 : vector<128xf32> to vector<128x1xf32>
      %cst = arith.constant dense<0.000000e+00> : vector<128x256xf32>
      %31 = tpu.matmul %18, %20, %cst {dimension_numbers = #tpu.dot_dimension_numbers<[1], [1], [0], [0], [0, 0, 1, 0], [], []>, transpose_lhs_hint = false} : vector<128x128xbf16>, vector<256x128xbf16>, vector<128x256xf32> -> vector<128x256xf32>
      %c256_i32 = arith.constant 256 : i32
      %32 = arith.muli %11, %c256_i32 : i32
      %33 = tpu.iota {dimensions = array<i32: 1>} : vector<128x256xi32>
      %34 = vector.broadcast %32 : i32 to vector<128x256xi32>
      %35 = arith.addi %34, %33 : vector<128x256xi32>
      %c0_24 = arith.constant 0 : index
      %c0_25 = arith.constant 0 : index
      %36 = vector.load %arg11[%c0_24, %c0_25] : memref<128x128xi32, #tpu.memory_space<vmem>>, vector<128x128xi32>
      %37 = tpu.concatenate %36, %36 in 1 : vector<128x128xi32>, vector<128x128xi32> -> vector<128x256xi32>
      %38 = arith.cmpi sge, %37, %35 : vector<128x256xi32>
      %cst_26 = arith.constant -2.38197633E+38 : f32
      %39 = vector.broadcast %cst_26 : f32 to vector<128x256xf32>
      %40 = arith.select %38, %31, %39 : vector<128x256xi1>, vector<128x256xf32>
      %41 = vector.broadcast %25 : vector<128x1xf32> to vector<128x256xf32>
      %42 = arith.subf %40, %41 : vector<128x256xf32>
      %43 = math.exp %42 : vector<128x256xf32>
      %cst_27 = arith.constant dense<0.000000e+00> : vector<128x256xf32>
      %44 = tpu.matmul %27, %22, %cst_27 {dimension_numbers = #tpu.dot_dimension_numbers<[1], [1], [0], [0], [0, 0, 1, 0], [], []>, transpose_lhs_hint = false} : vector<128x128xbf16>, vector<256x128xbf16>, vector<128x256xf32> -> vector<128x256xf32>
      %45 = vector.broadcast %30 : vector<128x1xf32> to vector<128x256xf32>
      %46 = arith.subf %44, %45 : vector<128x256xf32>
      %47 = arith.mulf %46, %43 : vector<128x256xf32>
      %c0_28 = arith.constant 0 : index
      %c0_29 = arith.constant 0 : index
      %48 = vector.load %arg12[%c0_28, %c0_29] : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>
      %49 = arith.truncf %47 : vector<128x256xf32> to vector<128x256xbf16>
      %cst_30 = arith.constant dense<0.000000e+00> : vector<128x128xf32>
      %50 = tpu.matmul %49, %20, %cst_30 {dimension_numbers = #tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>, transpose_lhs_hint = false} : vector<128x256xbf16>, vector<256x128xbf16>, vector<128x128xf32> -> vector<128x128xf32>
      %51 = arith.addf %48, %50 : vector<128x128xf32>
      %c0_31 = arith.constant 0 : index
      %c0_32 = arith.constant 0 : index
      %52 = vector.load %arg12[%c0_31, %c0_32] : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>
      tpu.vector_store %arg12[%c0_31, %c0_32], %51 {strides = array<i32>} : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>, 
    } else {
    }
    %c0_i32_4 = arith.constant 0 : i32
    %14 = arith.cmpi eq, %arg2, %c0_i32_4 : i32
    %15 = arith.extui %14 : i1 to i32
    %c0_i32_5 = arith.constant 0 : i32
    %16 = arith.cmpi ne, %15, %c0_i32_5 : i32
    scf.if %16 {
      %c0_6 = arith.constant 0 : index
      %c0_7 = arith.constant 0 : index
      %17 = vector.load %arg12[%c0_6, %c0_7] : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>
      %18 = arith.truncf %17 : vector<128x128xf32> to vector<128x128xbf16>
      %c0_8 = arith.constant 0 : index
      %c0_9 = arith.constant 0 : index
      %c0_10 = arith.constant 0 : index
      %19 = vector.load %arg13[%c0_8, %c0_9, %c0_10] : memref<1x128x128xbf16, #tpu.memory_space<vmem>>, vector<1x128x128xbf16>
      %20 = vector.shape_cast %19 : vector<1x128x128xbf16> to vector<128x128xbf16>
      %21 = vector.shape_cast %18 : vector<128x128xbf16> to vector<1x128x128xbf16>
      tpu.vector_store %arg13[%c0_8, %c0_9, %c0_10], %21 {strides = array<i32>} : memref<1x128x128xbf16, #tpu.memory_space<vmem>>, vector<1x128x128xbf16>, 
      %cst = arith.constant 0.000000e+00 : f32
      %22 = vector.broadcast %cst : f32 to vector<128x128xf32>
      %c0_11 = arith.constant 0 : index
      %c0_12 = arith.constant 0 : index
      %23 = vector.load %arg12[%c0_11, %c0_12] : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>
      tpu.vector_store %arg12[%c0_11, %c0_12], %22 {strides = array<i32>} : memref<128x128xf32, #tpu.memory_space<vmem>>, vector<128x128xf32>, 
    } else {
    }
    return
  }
  func.func @transform_0(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %arg1, %c0_i32 : i32, i32, i32
  }
  func.func @transform_1(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0 = arith.constant 0 : index
    %0 = arith.index_cast %arg1 : i32 to index
    %1 = arith.index_cast %arg2 : i32 to index
    %2 = memref.load %arg4[%c0, %0, %1] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %3 = arith.extsi %2 : i8 to i32
    %c0_i32 = arith.constant 0 : i32
    %4 = arith.cmpi sgt, %3, %c0_i32 : i32
    %c0_0 = arith.constant 0 : index
    %5 = arith.index_cast %arg1 : i32 to index
    %6 = arith.index_cast %arg2 : i32 to index
    %7 = memref.load %arg3[%c0_0, %5, %6] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %8 = arith.extsi %7 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %c0_i32_2 = arith.constant 0 : i32
    return %arg0, %8, %c0_i32_1 : i32, i32, i32
  }
  func.func @transform_2(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0 = arith.constant 0 : index
    %0 = arith.index_cast %arg1 : i32 to index
    %1 = arith.index_cast %arg2 : i32 to index
    %2 = memref.load %arg4[%c0, %0, %1] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %3 = arith.extsi %2 : i8 to i32
    %c0_i32 = arith.constant 0 : i32
    %4 = arith.cmpi sgt, %3, %c0_i32 : i32
    %c0_0 = arith.constant 0 : index
    %5 = arith.index_cast %arg1 : i32 to index
    %6 = arith.index_cast %arg2 : i32 to index
    %7 = memref.load %arg3[%c0_0, %5, %6] : memref<1x2x1xi8, #tpu.memory_space<smem>>
    %8 = arith.extsi %7 : i8 to i32
    %c0_i32_1 = arith.constant 0 : i32
    %c0_i32_2 = arith.constant 0 : i32
    return %arg0, %8, %c0_i32_1 : i32, i32, i32
  }
  func.func @transform_3(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %c0_i32, %arg1 : i32, i32, i32
  }
  func.func @transform_4(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %arg1, %c0_i32 : i32, i32, i32
  }
  func.func @transform_5(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %c0_i32, %arg1 : i32, i32, i32
  }
  func.func @transform_6(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg1, %c0_i32 : i32, i32
  }
  func.func @transform_7(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    %c0_i32_1 = arith.constant 0 : i32
    return %c0_i32, %c0_i32_0 : i32, i32
  }
  func.func @transform_8(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: memref<1x2x1xi8, #tpu.memory_space<smem>>, %arg4: memref<1x2x1xi8, #tpu.memory_space<smem>>) -> (i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %arg1, %c0_i32 : i32, i32, i32
  }
}
