-- Argo CD health check of orchard.dev/RolloutGroup (resource.customizations.health.orchard.dev_RolloutGroup).
-- Reads the kstatus conditions the operator writes (Stalled, Reconciling), Complete and status.phase;
-- see docs/OPERATIONS.md for the table of states. Argo CD runs this with gopher-lua and only the base and
-- table libraries: no string.* calls here.
local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c)
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "RolloutGroup is being deleted"
  return hs
end
local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator"
  return hs
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local phase = status.phase or ""
local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled)
  return hs
end
local complete = condition(status, "Complete")
if phase == "Failed" then
  hs.status = "Degraded"
  if complete ~= nil then
    hs.message = "Failed: " .. describe(complete)
  else
    hs.message = "Failed"
  end
  return hs
end
if phase == "Complete" and complete ~= nil and complete.status == "True" then
  hs.status = "Healthy"
  hs.message = "Complete: selection " .. (status.selection or "unknown")
  return hs
end
local reconciling = condition(status, "Reconciling")
hs.status = "Progressing"
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = describe(reconciling)
elseif phase == "" then
  hs.message = "Waiting for the operator"
else
  hs.message = "Phase " .. phase
end
return hs
