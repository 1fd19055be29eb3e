//! The model layer (Qwen loaders, pipelines, generation) is not written yet; it is the subject
//! of the model issues. Nothing here is callable until then.
