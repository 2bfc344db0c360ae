//! A request's tensors in clients' shared-memory regions, found in the server's registry
//! before the request is queued, and its outputs written there once it has run.
//!
//! An input window is held with the request and copied from the region straight into its
//! batch's segment, or, from [`PLACED_BYTES`] on, becomes a place in the client's object that
//! the worker maps and reads itself (a BYTES tensor is read at once, for its framing to be
//! checked). An output window is held until the answer: the core copies the output into it,
//! unless the worker wrote it there itself (from [`PLACED_BYTES`] on, while the client's object
//! is still the one registered). The answer then carries the output's name, datatype and shape
//! only.
//!
//! Anything wrong (an unknown region, a window outside it, a size that does not match the
//! tensor) leaves the request to the reference path, which words Triton's errors; nothing here
//! refuses a request.

use std::os::unix::fs::MetadataExt;

use super::response::ResponseParts;
use crate::error::CoreError;
#[cfg(test)]
use crate::infer::DataType;
use crate::infer::{
    BodyObject, CoreOutput, CoreRequest, ObjectPlace, OutputRegion, RegionRef, RegionWindow,
    TensorData, fits,
};
use crate::shm::{Region, RegionRegistry, SHM_DIR};

/// Tensors from this size on are read and written by the worker in the client's object: below
/// it a copy costs about what the system calls that check the object do.
pub const PLACED_BYTES: u64 = 256 * 1024;

/// Finds `request`'s windows in `regions`: true when every one is there and fits its tensor.
pub fn resolve(request: &mut CoreRequest, regions: &RegionRegistry) -> bool {
    resolve_all(request, regions).is_some()
}

fn resolve_all(request: &mut CoreRequest, regions: &RegionRegistry) -> Option<()> {
    for input in &mut request.inputs {
        let TensorData::Region(named) = &input.data else {
            continue;
        };
        let region = regions.get(&named.region).ok()?;
        let count = input
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))?;
        region.address(named.offset, named.byte_size).ok()?;
        input.data = match input.datatype.element_size() {
            Some(size) if count.checked_mul(size as u64)? != named.byte_size => return None,
            Some(_) => match object_place(&region, named) {
                Some(place) => TensorData::Placed(place, named.byte_size),
                None => TensorData::Window(RegionWindow {
                    region,
                    offset: named.offset,
                    byte_size: named.byte_size,
                }),
            },
            None => {
                // BYTES: read now, for their framing to be checked.
                let bytes = region.read(named.offset, named.byte_size).ok()?;
                if !fits(input.datatype, usize::try_from(count).ok()?, &bytes) {
                    return None;
                }
                TensorData::Owned(bytes)
            }
        };
    }
    let mut places = Vec::new();
    for output in request.outputs.iter_mut().flatten() {
        let Some(OutputRegion::Named(named)) = &output.region else {
            continue;
        };
        let region = regions.get(&named.region).ok()?;
        region.address(named.offset, named.byte_size).ok()?;
        if let Some(place) = object_place(&region, named) {
            places.push((output.name.clone(), place));
        }
        output.region = Some(OutputRegion::Window(RegionWindow {
            region,
            offset: named.offset,
            byte_size: named.byte_size,
        }));
    }
    request.output_places.extend(places);
    Some(())
}

/// Where a window of `PLACED_BYTES` or more (checked to lie in its region) lies in the
/// region's object, for the worker to map; None for a smaller one, or one whose object the
/// worker can no longer open by its name (unlinked or replaced since it was registered: the
/// worker then gets a copy from the server's mapping).
fn object_place(region: &Region, named: &RegionRef) -> Option<ObjectPlace> {
    if named.byte_size < PLACED_BYTES {
        return None;
    }
    let (device, inode) = region.object_identity()?;
    let info = region.info();
    // (The key is a checked POSIX object name.)
    let path = format!("{SHM_DIR}/{}", info.key.trim_start_matches('/'));
    let now = std::fs::symlink_metadata(&path).ok()?;
    if (now.dev(), now.ino()) != (device, inode) {
        return None;
    }
    Some(ObjectPlace {
        path,
        device,
        inode,
        offset: info.offset.checked_add(named.offset)?,
        byte_size: named.byte_size,
    })
}

/// Gives each input of `request` whose bytes lie in its body, `body` (received into the
/// shared-memory object `object`), a place in that object when it takes [`PLACED_BYTES`] or
/// more: the worker reads it where it was received, where the driver would copy it into the
/// batch's segment. (BYTES tensors stay: the worker reads their framing from a segment.) The
/// request then names the object, so that an output the worker finds lying in it is answered
/// from the body ([`in_body`]).
pub fn place_in_body(request: &mut CoreRequest, object: &BodyObject) {
    let mut placed = false;
    for input in &mut request.inputs {
        let TensorData::Body(range) = &input.data else {
            continue;
        };
        let len = range.len() as u64;
        if len < PLACED_BYTES || input.datatype.element_size().is_none() {
            continue;
        }
        let place = ObjectPlace {
            path: object.path.clone(),
            device: object.device,
            inode: object.inode,
            offset: range.start as u64,
            byte_size: len,
        };
        input.data = TensorData::Placed(place, len);
        placed = true;
    }
    if placed {
        request.body_object = Some(Box::new(object.clone()));
    }
}

/// Whether `place`, where a worker answered an output lies, is in `request`'s own body object.
pub fn is_body_place(request: &CoreRequest, place: &ObjectPlace) -> bool {
    request.body_object.as_ref().is_some_and(|object| {
        (object.path.as_str(), object.device, object.inode)
            == (place.path.as_str(), place.device, place.inode)
    })
}

/// The bytes of an output a worker answered as lying at `place` in `request`'s own body
/// (a view of an input it read there: nothing was copied), from `body`; None for a place
/// elsewhere, or one outside the body (the object's bytes past it are not this request's).
pub fn in_body<'a>(request: &CoreRequest, place: &ObjectPlace, body: &'a [u8]) -> Option<&'a [u8]> {
    if !is_body_place(request, place) {
        return None;
    }
    let start = usize::try_from(place.offset).ok()?;
    let len = usize::try_from(place.byte_size).ok()?;
    body.get(start..start.checked_add(len)?)
}

/// Writes each output of a response that `request` wants in a region there (those the worker
/// did not write there itself); Triton's error for one that does not fit.
pub fn write_outputs(request: &CoreRequest, response: &ResponseParts<'_>) -> Result<(), CoreError> {
    for slot in response.outputs {
        let Some(CoreOutput {
            region: Some(OutputRegion::Window(window)),
            ..
        }) = request.output(&slot.name)
        else {
            continue;
        };
        if let Some(bytes) = response.data(request, slot)? {
            write_output(window, &slot.name, bytes)?;
        }
    }
    Ok(())
}

/// Writes `bytes`, output `name`'s, into its window: Triton's error when they do not fit.
pub fn write_output(window: &RegionWindow, name: &str, bytes: &[u8]) -> Result<(), CoreError> {
    if bytes.len() as u64 > window.byte_size {
        return Err(CoreError::internal(format!(
            "shared memory size specified with the request for output '{name}' ({} bytes) \
             should be at least {} bytes to hold the results",
            window.byte_size,
            bytes.len()
        )));
    }
    window.region.write(window.offset, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::CoreInput;

    /// A POSIX shared-memory object for one test, unlinked on drop.
    struct Object(String);

    impl Object {
        fn new(tag: &str, bytes: &[u8]) -> Self {
            let key = format!("/tfcore-regions-{}-{tag}", std::process::id());
            std::fs::write(format!("{SHM_DIR}{key}"), bytes).expect("create shm object");
            Object(key)
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(format!("{SHM_DIR}{}", self.0));
        }
    }

    fn input(
        datatype: DataType,
        shape: Vec<u64>,
        region: &str,
        offset: u64,
        size: u64,
    ) -> CoreInput {
        CoreInput {
            name: "IN".into(),
            datatype,
            shape,
            data: TensorData::Region(RegionRef {
                region: region.into(),
                offset,
                byte_size: size,
            }),
        }
    }

    fn output(region: &str, offset: u64, size: u64) -> CoreOutput {
        CoreOutput {
            name: "OUT".into(),
            binary: false,
            region: Some(OutputRegion::Named(RegionRef {
                region: region.into(),
                offset,
                byte_size: size,
            })),
        }
    }

    #[test]
    fn copies_small_inputs_and_places_large_ones() {
        let big = usize::try_from(PLACED_BYTES).unwrap();
        let mut bytes = vec![0u8; 4096 + big];
        bytes[4096 + 8..4096 + 12].copy_from_slice(&7f32.to_le_bytes());
        let object = Object::new("inputs", &bytes);
        let regions = RegionRegistry::new();
        regions
            .register("r", &object.0, 4096, PLACED_BYTES)
            .unwrap();
        let mut request = CoreRequest {
            inputs: vec![
                input(DataType::Fp32, vec![1], "r", 8, 4),
                input(DataType::Uint8, vec![big as u64], "r", 0, PLACED_BYTES),
            ],
            outputs: Some(vec![output("r", 0, 16), output("r", 0, PLACED_BYTES)]),
            ..CoreRequest::default()
        };
        assert!(resolve(&mut request, &regions));
        // The small input is copied from the region when its batch is laid out.
        assert!(matches!(request.inputs[0].data, TensorData::Window(_)));
        let mut copied = [0u8; 4];
        request.inputs[0].data.copy_into(&[], &mut copied).unwrap();
        assert_eq!(copied, 7f32.to_le_bytes());
        let TensorData::Placed(place, len) = &request.inputs[1].data else {
            panic!("not placed: {:?}", request.inputs[1].data)
        };
        assert_eq!((place.offset, *len), (4096, PLACED_BYTES));
        assert_eq!(place.path, format!("{SHM_DIR}{}", object.0));
        let outputs = request.outputs.as_ref().unwrap();
        let Some(OutputRegion::Window(window)) = &outputs[0].region else {
            panic!("no window")
        };
        write_output(window, "OUT", &[1, 2]).unwrap();
        assert_eq!(regions.get("r").unwrap().read(0, 2).unwrap(), [1, 2]);
        let error = write_output(window, "OUT", &[0; 17]).unwrap_err();
        assert!(
            error
                .message
                .contains("(16 bytes) should be at least 17 bytes")
        );
        assert!(matches!(outputs[1].region, Some(OutputRegion::Window(_))));
        assert_eq!(request.output_places.len(), 1);
        assert_eq!(request.output_places[0].1.offset, 4096);
    }

    #[test]
    fn places_large_body_inputs_and_finds_outputs_in_the_body() {
        let big = usize::try_from(PLACED_BYTES).unwrap();
        let body_input = |datatype, range: std::ops::Range<usize>| CoreInput {
            name: "IN".into(),
            datatype,
            shape: vec![1],
            data: TensorData::Body(range),
        };
        let mut request = CoreRequest {
            inputs: vec![
                body_input(DataType::Fp32, 100..104),
                body_input(DataType::Uint8, 128..128 + big),
                body_input(DataType::Bytes, 128 + big..128 + 2 * big),
            ],
            ..CoreRequest::default()
        };
        let object = BodyObject {
            path: "/dev/shm/tritonfast-body-1-2".into(),
            device: 3,
            inode: 4,
        };
        place_in_body(&mut request, &object);
        assert_eq!(request.body_object.as_deref(), Some(&object));
        // Small and BYTES inputs stay in the body, copied into the batch's segment.
        assert!(matches!(request.inputs[0].data, TensorData::Body(_)));
        assert!(matches!(request.inputs[2].data, TensorData::Body(_)));
        let TensorData::Placed(place, len) = &request.inputs[1].data else {
            panic!("not placed: {:?}", request.inputs[1].data)
        };
        assert_eq!(
            (place.offset, place.byte_size, *len),
            (128, PLACED_BYTES, PLACED_BYTES)
        );
        assert_eq!(place.path, object.path);
        let body: Vec<u8> = (0..128 + 2 * big)
            .map(|i| u8::try_from(i % 251).unwrap())
            .collect();
        let at = |offset, byte_size| ObjectPlace {
            offset,
            byte_size,
            ..place.clone()
        };
        assert_eq!(in_body(&request, &at(130, 3), &body), Some(&body[130..133]));
        let past = (128 + 2 * big) as u64;
        assert_eq!(
            in_body(&request, &at(past - 1, 2), &body),
            None,
            "past the body"
        );
        let elsewhere = ObjectPlace {
            inode: 5,
            ..at(130, 3)
        };
        assert!(!is_body_place(&request, &elsewhere));
        assert_eq!(in_body(&request, &elsewhere, &body), None);
        let unplaced = CoreRequest::default();
        assert_eq!(in_body(&unplaced, &at(130, 3), &body), None);
    }

    #[test]
    fn leaves_what_does_not_fit_to_the_reference_path() {
        let object = Object::new("refusals", &[0u8; 64]);
        let regions = RegionRegistry::new();
        regions.register("r", &object.0, 0, 64).unwrap();
        let refused = [
            input(DataType::Fp32, vec![1], "nowhere", 0, 4),
            input(DataType::Fp32, vec![2], "r", 0, 4),
            input(DataType::Fp32, vec![1], "r", 62, 4),
            // 64 zero bytes frame 16 empty strings, not 3.
            input(DataType::Bytes, vec![3], "r", 0, 64),
        ];
        for refused in refused {
            let mut request = CoreRequest {
                inputs: vec![refused],
                ..CoreRequest::default()
            };
            assert!(!resolve(&mut request, &regions), "{:?}", request.inputs);
        }
        let mut request = CoreRequest {
            outputs: Some(vec![output("r", 60, 8)]),
            ..CoreRequest::default()
        };
        assert!(!resolve(&mut request, &regions));
    }
}
